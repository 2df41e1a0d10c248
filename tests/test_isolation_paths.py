"""What the private /tmp must keep visible: every import path of the validator under it."""
import sys

from grpo_conform.isolation.privilege import _needed_under


def test_a_sys_path_entry_under_a_private_place_stays_exposed(tmp_path, monkeypatch):
    site = tmp_path / "site"  # as `pip install --target /tmp/site` and PYTHONPATH=/tmp/site leave it
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    assert str(site) in _needed_under(str(tmp_path))


def test_nothing_else_under_the_place_is_exposed(tmp_path, monkeypatch):
    (tmp_path / "other").mkdir()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not p.startswith(str(tmp_path))])
    assert str(tmp_path / "other") not in _needed_under(str(tmp_path))
