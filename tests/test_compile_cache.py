"""The workers' compile caches kept per implementation between runs (grpo_conform/isolation/compile_cache.py):
what a worker leaves in its Triton cache reaches the next worker of the same implementation and no other;
links, oversized files and files already stored are never taken; the switch turns it off."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from grpo_conform.implementations import load_implementation
from grpo_conform.isolation import compile_cache
from grpo_conform.isolation.session import WorkerSession
from triton_compile import KERNEL, compile_in

ROOT = Path(__file__).resolve().parent.parent

WRITER = '''
import json
import os

# at import: what a JIT compiler does at a kernel's first call
_folder = os.path.join(os.environ["TRITON_CACHE_DIR"], "ab12")
os.makedirs(_folder, exist_ok=True)
with open(os.path.join(_folder, "kernel.cubin"), "w") as _f:
    _f.write("compiled")


def grpo_loss(logits, **kw):
    return logits.float().sum() * 0.0
'''


def _impl(tmp_path: Path, name: str, extra: str = "") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "impl.py").write_text(WRITER + extra)
    (folder / "implementation.toml").write_text(
        f'name = "{name}"\nspec = "grpo"\nmembers = ["token-is"]\nentry = "impl:grpo_loss"\n'
        'language = "torch"\nlicense = "MIT"\ndevices = ["cpu"]\ndescription = "writes into its Triton cache"\n')
    return folder


def _run_once(folder: Path) -> dict:
    impl = load_implementation(folder)
    with WorkerSession(impl, {}, torch.device("cpu"), 60.0, interpret=True) as session:
        info = dict(session.info)
        session.request(op="drop")
    return info


def test_the_store_reaches_the_next_worker_of_the_same_implementation_only(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    a = _impl(tmp_path, "writer-a")
    first = _run_once(a)
    assert first["compile_cache"] == {"reused_files": 0}
    stores = list((tmp_path / "cache" / "worker-compile").iterdir())
    assert len(stores) == 1 and (stores[0] / ".triton" / "ab12" / "kernel.cubin").read_text() == "compiled"
    assert _run_once(a)["compile_cache"] == {"reused_files": 1}
    b = _impl(tmp_path, "writer-b", extra="\n# another folder, another identity\n")
    assert _run_once(b)["compile_cache"] == {"reused_files": 0}
    monkeypatch.setenv(compile_cache.ENV_SWITCH, "0")
    assert "off" in _run_once(a)["compile_cache"]


def test_harvest_takes_regular_files_only_and_never_replaces(tmp_path, monkeypatch):
    home, store = tmp_path / "home", tmp_path / "store"
    (home / ".triton" / "k").mkdir(parents=True)
    (home / ".triton" / "k" / "a.cubin").write_bytes(b"new")
    (home / ".triton" / "k" / "big.bin").write_bytes(b"x" * 64)
    secret = tmp_path / "signing-key.pem"
    secret.write_text("PRIVATE")
    (home / ".triton" / "k" / "key.pem").symlink_to(secret)
    os.link(secret, home / ".triton" / "k" / "hard.pem")  # a hard link: the same file, another name
    (home / ".triton" / "linked").symlink_to(tmp_path, target_is_directory=True)
    (store / ".triton" / "k").mkdir(parents=True)
    (store / ".triton" / "k" / "a.cubin").write_bytes(b"old")
    monkeypatch.setattr(compile_cache, "MAX_FILE_BYTES", 32)
    assert compile_cache.harvest(home, store) == 0
    assert (store / ".triton" / "k" / "a.cubin").read_bytes() == b"old"
    assert sorted(p.name for p in (store / ".triton").rglob("*")) == ["a.cubin", "k"]
    monkeypatch.setattr(compile_cache, "MAX_FILE_BYTES", 1 << 20)
    assert compile_cache.harvest(home, store) == 1  # big.bin now; never the link's target
    assert not any("PRIVATE" in p.read_text() for p in store.rglob("*") if p.is_file())


def test_seed_copies_the_store_and_a_missing_store_seeds_nothing(tmp_path):
    store, home = tmp_path / "store", tmp_path / "home"
    assert compile_cache.seed(store, home, None, None) == 0
    (store / ".inductor" / "x").mkdir(parents=True)
    (store / ".inductor" / "x" / "graph.py").write_text("code")
    assert compile_cache.seed(store, home, None, None) == 1
    assert (home / ".inductor" / "x" / "graph.py").read_text() == "code"


def test_the_key_depends_on_identity_and_device():
    keys = {compile_cache.store_key(i, d) for i in ("a" * 64, "b" * 64) for d in ("cpu", "cuda")}
    assert len(keys) == 4


def test_stores_unused_for_a_month_are_pruned(tmp_path):
    stores = tmp_path / "worker-compile"
    old, recent, kept = stores / "old", stores / "recent", stores / "kept"
    for d in (old, recent, kept):
        (d / ".triton").mkdir(parents=True)
    now = 1_000_000_000.0
    os.utime(old, (now - 31 * 86400, now - 31 * 86400))
    os.utime(kept, (now - 90 * 86400, now - 90 * 86400))  # the store in use is never removed
    os.utime(recent, (now - 2 * 86400, now - 2 * 86400))
    assert compile_cache.prune(stores, keep=kept, now=now) == ["old"]
    assert sorted(p.name for p in stores.iterdir()) == ["kept", "recent"]


def test_the_least_recently_used_stores_go_when_all_of_them_hold_too_much(tmp_path, monkeypatch):
    """A hostile implementation edited once per commit makes a new store each time: together they stay
    within MAX_TOTAL_BYTES, the oldest going first and the store in use never."""
    stores = tmp_path / "worker-compile"
    now = 1_000_000_000.0
    for age, name in ((5, "a"), (4, "b"), (3, "c"), (9, "kept")):
        (stores / name / ".triton").mkdir(parents=True)
        (stores / name / ".triton" / "k.bin").write_bytes(b"x" * 100)
        os.utime(stores / name, (now - age * 86400, now - age * 86400))
    monkeypatch.setattr(compile_cache, "MAX_TOTAL_BYTES", 250)
    assert compile_cache.prune(stores, keep=stores / "kept", now=now) == ["a", "b"]
    assert sorted(p.name for p in stores.iterdir()) == ["c", "kept"]


def _stored_kernel(store: Path, old_home: str, names=("k.cubin", "k.json")) -> Path:
    """A kernel as a worker with HOME `old_home` left it in the store: its files and Triton's group file
    naming them by that worker's absolute paths."""
    folder = store / ".triton" / "HASH"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text(name)
    group = {"child_paths": {n: f"{old_home}/.triton/HASH/{n}" for n in names}}
    (folder / "__grp__k.json").write_text(json.dumps(group))
    return folder


def test_a_stored_kernel_is_found_by_triton_in_the_next_worker_s_home(tmp_path, monkeypatch):
    """Without the relocation Triton finds no stored kernel: the group names the old HOME's paths (every
    worker compiled everything again, round35b)."""
    cache = pytest.importorskip("triton.runtime.cache")
    store, home = tmp_path / "store", tmp_path / "home"
    _stored_kernel(store, str(tmp_path / "gone" / "home"))
    assert compile_cache.seed(store, home, None, None) == 3
    monkeypatch.setenv("TRITON_CACHE_DIR", str(home / ".triton"))
    found = cache.FileCacheManager("HASH").get_group("k.json")
    assert found == {n: str(home / ".triton" / "HASH" / n) for n in ("k.cubin", "k.json")}


@pytest.mark.parametrize("child", ["../../outside.cubin", "missing.cubin", "link.cubin"])
def test_a_group_naming_anything_but_its_own_siblings_is_left_as_it_was(tmp_path, child):
    """A hostile group file (the implementation writes its cache) cannot be pointed outside its folder,
    nor at a link or a file that is not there: it stays as written and Triton compiles."""
    store, home = tmp_path / "store", tmp_path / "home"
    folder = _stored_kernel(store, "/old/home")
    (tmp_path / "outside.cubin").write_text("x")
    group = json.loads((folder / "__grp__k.json").read_text())
    group["child_paths"][Path(child).name if child != "../../outside.cubin" else child] = f"/old/home/{child}"
    (folder / "__grp__k.json").write_text(json.dumps(group))
    compile_cache.seed(store, home, None, None)
    if child == "link.cubin":  # a link in the worker's copy (seed copies regular files only: made here)
        (home / ".triton" / "HASH" / "link.cubin").symlink_to(tmp_path / "outside.cubin")
        assert not compile_cache.relocate_group(home / ".triton" / "HASH" / "__grp__k.json")
    assert json.loads((home / ".triton" / "HASH" / "__grp__k.json").read_text()) == group


def test_a_spawned_worker_runs_no_implementation_code_until_it_is_loaded(tmp_path, monkeypatch):
    """A timed turn spawns its worker before its exclusive hold (check._spawn_early): the implementation's
    import (here: it writes into its cache at import) must not happen before `load`."""
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "cache"))
    impl = load_implementation(_impl(tmp_path, "writer-late"))
    session = WorkerSession(impl, {}, torch.device("cpu"), 60.0, interpret=True)
    try:
        session.spawn()
        session.warm()  # validator code only: no implementation code either
        assert session.info == {} and session.directory is not None
        marker = session.directory / "home" / ".triton" / "ab12" / "kernel.cubin"
        assert not marker.exists()
        session.load()
        assert marker.read_text() == "compiled" and session.info["compile_cache"] == {"reused_files": 0}
    finally:
        session.close()


def test_a_kernel_compiled_in_one_worker_s_home_is_not_compiled_again_in_the_next(tmp_path, monkeypatch):
    """The store end to end with Triton's real compiler (round35b on the H200: every worker compiled every
    kernel again). One "worker" compiles in its HOME, its cache goes to the store and the HOME is removed,
    as a session's is; the next one, seeded in another HOME, must find the kernel without building a cubin."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    script = tmp_path / "compile.py"
    script.write_text(KERNEL)
    first, store = tmp_path / "first" / "home", tmp_path / "store"
    first.mkdir(parents=True)
    assert compile_in(first, script) == {"compiled": 1}
    assert compile_cache.harvest(first, store) > 0
    shutil.rmtree(first.parent)
    second = tmp_path / "second" / "home"
    second.mkdir(parents=True)
    compile_cache.seed(store, second, None, None)
    assert compile_in(second, script) == {"compiled": 0}
