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


def test_a_scratch_tree_below_a_private_place_stays_exposed(tmp_path):
    # TMPDIR=/tmp/x/y (pytest's, a CI runner's): the worker's scratch tree must survive the private /tmp.
    from grpo_conform.isolation.privilege import private_scratch_mounts
    scratch = tmp_path / "deep" / "session"
    mounts = private_scratch_mounts(scratch, "cpu")
    tmp = next((m for m in mounts if m["cover"] == "/tmp"), None)
    if tmp is not None and str(tmp_path).startswith("/tmp/"):
        assert any(str(scratch).startswith(e + "/") for e in tmp["expose"]), tmp["expose"]
