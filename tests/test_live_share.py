"""Compiled kernels passed between running workers of one implementation (grpo_conform/isolation/live_share.py,
WorkerSession.share_compiled): a kernel one worker compiled reaches another that is already running, whole
and pointing at its own copies; nothing is written through a link the worker planted, no folder it holds is
touched, an incomplete stored kernel is not copied, and a live harvest follows no link."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grpo_conform.implementations import load_implementation
from grpo_conform.isolation import compile_cache, live_share
from grpo_conform.isolation.session import WorkerSession
from triton_compile import KERNEL, LEAVE_KERNEL, compile_in

NAMES = ("k.cubin", "k.json")


def _kernel(cache: Path, folder: str = "HASH", old_home: str = "/gone/home", names=NAMES) -> Path:
    """A Triton kernel folder as a worker whose HOME was `old_home` writes it: files and the group naming them."""
    d = cache / ".triton" / folder
    d.mkdir(parents=True)
    for n in names:
        (d / n).write_text(n)
    (d / "__grp__k.json").write_text(json.dumps({"child_paths": {n: f"{old_home}/.triton/{folder}/{n}" for n in NAMES}}))
    return d


def test_a_stored_kernel_reaches_a_running_worker_s_cache_pointing_at_its_copies(tmp_path, monkeypatch):
    store, home = tmp_path / "store", tmp_path / "home"
    _kernel(store)
    (home / ".triton" / "OWN").mkdir(parents=True)  # the worker's own compiles: its cache exists
    assert live_share.top_up(store, home, None, None) == 1
    assert live_share.top_up(store, home, None, None) == 0  # once
    group = json.loads((home / ".triton" / "HASH" / "__grp__k.json").read_text())
    assert group["child_paths"] == {n: str(home / ".triton" / "HASH" / n) for n in NAMES}
    assert not list((home / ".triton" / "HASH").glob(".part-*"))
    cache = pytest.importorskip("triton.runtime.cache")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(home / ".triton"))
    assert cache.FileCacheManager("HASH").get_group("k.json") == group["child_paths"]


def test_a_folder_the_worker_holds_is_left_as_it_is(tmp_path):
    store, home = tmp_path / "store", tmp_path / "home"
    _kernel(store)
    mine = home / ".triton" / "HASH"
    mine.mkdir(parents=True)
    (mine / "k.cubin").write_text("the worker's own")
    assert live_share.top_up(store, home, None, None) == 0
    assert sorted(p.name for p in mine.iterdir()) == ["k.cubin"] and (mine / "k.cubin").read_text() == "the worker's own"


@pytest.mark.parametrize("broken", ["no-group", "missing-child", "not-json"])
def test_an_incomplete_stored_kernel_is_not_copied(tmp_path, broken):
    """A harvest still writing the folder (its group comes last, a child may be missing) or a folder that
    is no kernel: Triton would compile anyway, and a group naming a missing file would be a dead entry."""
    store, home = tmp_path / "store", tmp_path / "home"
    d = _kernel(store)
    if broken == "no-group":
        (d / "__grp__k.json").unlink()
    elif broken == "missing-child":
        (d / "k.json").unlink()
    else:
        (d / "__grp__k.json").write_text("{")
    assert live_share.top_up(store, home, None, None) == 0
    assert not (home / ".triton" / "HASH").exists()


def test_a_planted_link_makes_it_write_nothing_outside_the_worker_s_cache(tmp_path):
    """The worker owns its HOME while it runs: its cache (or a kernel folder) made a link to a place the
    validator can write must not receive the copies."""
    store, home, outside = tmp_path / "store", tmp_path / "home", tmp_path / "outside"
    _kernel(store)
    outside.mkdir()
    home.mkdir()
    (home / ".triton").symlink_to(outside)
    assert live_share.top_up(store, home, None, None) == 0
    assert list(outside.iterdir()) == []
    (home / ".triton").unlink()
    (home / ".triton").mkdir()
    (home / ".triton" / "HASH").symlink_to(outside)  # the folder's name taken by a link: it holds "HASH"
    assert live_share.top_up(store, home, None, None) == 0
    assert list(outside.iterdir()) == []


def test_a_live_harvest_follows_no_link_into_a_folder_the_worker_cannot_read(tmp_path):
    """A folder of the cache swapped for a link to the validator's own files (a key): os.fwalk never
    enters it, so nothing of it reaches the store (and from there another worker)."""
    store, home, secret = tmp_path / "store", tmp_path / "home", tmp_path / "keys"
    secret.mkdir()
    (secret / "signing-key.pem").write_text("PRIVATE")
    (home / ".triton").mkdir(parents=True)
    (home / ".triton" / "HASH").symlink_to(secret)
    _kernel(home, folder="REAL")
    assert compile_cache.harvest(home, store) == 3
    assert not (store / ".triton" / "HASH").exists()
    assert sorted(p.name for p in (store / ".triton" / "REAL").iterdir()) == ["__grp__k.json", *NAMES]


WRITER = LEAVE_KERNEL + '''

def grpo_loss(logits, **kw):
    return logits.float().sum() * 0.0


leave_kernel("first")  # at import: as a JIT compiler leaves one at a first launch
'''


def test_two_running_workers_share_a_kernel_between_two_workloads(tmp_path, monkeypatch):
    """End to end through WorkerSession: worker A compiles at its load; worker B, started before, gets
    A's kernel at its next `share_compiled` and the report counts it."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    folder = tmp_path / "impl"
    folder.mkdir()
    (folder / "impl.py").write_text(WRITER)
    (folder / "implementation.toml").write_text(
        'name = "writer"\nspec = "grpo"\nmembers = ["token-is"]\nentry = "impl:grpo_loss"\nlanguage = "torch"\n'
        'license = "MIT"\ndevices = ["cpu"]\ndescription = "writes a kernel folder into its Triton cache"\n')
    impl = load_implementation(folder)
    b = WorkerSession(impl, {}, torch.device("cpu"), 60.0, interpret=True)
    b.spawn()  # seeded from an empty store
    try:
        with WorkerSession(impl, {}, torch.device("cpu"), 60.0, interpret=True) as a:
            a.share_compiled()
        b.load()
        ours = b.directory / "home" / ".triton" / "first"
        os.rename(ours, ours.with_name("own"))  # B's load compiled "first" itself: only A's copy can bring it back
        b.share_compiled()
        assert b.info["compile_cache"] == {"reused_files": 0, "shared_kernels": 1}
        assert json.loads((ours / "__grp__k.json").read_text()) == {"child_paths": {"k.cubin": str(ours / "k.cubin")}}
    finally:
        b.close()


def test_a_kernel_a_running_worker_compiled_is_found_by_another_running_worker(tmp_path):
    """With Triton's real compiler: the second HOME already has a cache of its own (another kernel), as a
    running worker's has; after a harvest of the first and a top-up of the second, the second builds no
    cubin for the first's kernel."""
    script = tmp_path / "compile.py"
    script.write_text(KERNEL)
    first, second, store = tmp_path / "first", tmp_path / "second", tmp_path / "store"
    first.mkdir()
    second.mkdir()
    assert compile_in(first, script, 128) == {"compiled": 1}
    assert compile_in(second, script, 64) == {"compiled": 1}
    assert compile_cache.harvest(first, store) > 0
    assert live_share.top_up(store, second, None, None) >= 1
    assert compile_in(second, script, 128) == {"compiled": 0}


def test_a_live_harvest_skips_what_it_already_found_stored(tmp_path):
    """After every workload only the worker's new files are looked at (`known`, WorkerSession._in_store): a
    warm run's ~1,900 stored files cost one set lookup each, not a stat of the store and a copy check."""
    store, home = tmp_path / "store", tmp_path / "home"
    _kernel(home)
    known: set[str] = set()
    assert compile_cache.harvest(home, store, known) == 3
    assert known == {f".triton/HASH/{n}" for n in ("__grp__k.json", *NAMES)} | {".triton/HASH/"}
    (store / ".triton" / "HASH" / "k.cubin").unlink()
    assert compile_cache.harvest(home, store, known) == 0  # known: not looked at again
    assert compile_cache.harvest(home, store) == 1  # a fresh look finds it missing


def test_a_kernel_folder_stored_whole_is_not_walked_again(tmp_path):
    """A kernel folder (its group and every file stored) is skipped as a whole after that: a file added to it
    later is not taken (Triton writes a folder once; a worker adding to one gains nothing), while a new
    folder is."""
    store, home = tmp_path / "store", tmp_path / "home"
    folder = _kernel(home)
    known: set[str] = set()
    assert compile_cache.harvest(home, store, known) == 3
    (folder / "late.bin").write_text("late")
    _kernel(home, folder="NEW")
    assert compile_cache.harvest(home, store, known) == 3
    assert not (store / ".triton" / "HASH" / "late.bin").exists() and (store / ".triton" / "NEW").is_dir()
