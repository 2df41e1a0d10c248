"""The worker's compile caches (Triton's, TorchInductor's), kept between runs for one implementation.

Why: a worker that runs as another user gets a private, empty HOME per session, caches included
(session._PRIVATE_CACHES), so every run compiled every kernel of the implementation again. On the H200
that was most of a worker round trip's time at each member's first calls (docs/timing.md, "Eleventh
session"): a mask-b8 workload's worker was busy ~10 s, mostly in Triton's compiler, while the kernels
themselves ran for well under a second.

How: the validator keeps one store per implementation identity (the folder's file listing with its
hashes), torch and triton version and device type, under GRPO_CONFORM_CACHE_DIR (default
$XDG_CACHE_HOME/grpo-conform or ~/.cache/grpo-conform), readable by the validator's user only. At a
worker's start the store is copied into its private HOME (owned by the worker's user) and Triton's group
files are pointed at the copies (`relocate_group`: they name files by absolute path, and until the
fifteenth session every stored kernel was missed for that reason); when the worker has left normally, the
files it added are copied back (regular files with one link only: no symbolic or hard link; bounded in
size and count; a file already in the store is never replaced).

What an implementation can do with it: only its own identity's store is ever read, so one implementation
cannot plant compiled code that another loads (the reason the caches are private). An implementation
can leave files for its own next run, which its own code could then act on; its next run is judged in
full like any run, so nothing it leaves can make a wrong result pass, and every report says whether the
worker started with reused files (`worker.compile_cache`). GRPO_CONFORM_WORKER_CACHE=0 turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

ENV_SWITCH = "GRPO_CONFORM_WORKER_CACHE"
ENV_DIR = "GRPO_CONFORM_CACHE_DIR"
CACHES = (".triton", ".inductor")  # under the worker's HOME (session._PRIVATE_CACHES)
MAX_FILE_BYTES = 256 << 20
MAX_STORE_BYTES = 2 << 30
MAX_TOTAL_BYTES = 8 << 30  # every store together (prune)
MAX_FILES = 20_000
STALE_DAYS = 30


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip() != "0"


def base_dir() -> Path:
    explicit = os.environ.get(ENV_DIR, "").strip()
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "grpo-conform"


def store_key(identity: str, device_type: str) -> str:
    import torch  # lazily: the session imports this module; torch is loaded by then anyway

    try:
        import triton  # an optional dependency

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    text = "\n".join([identity, torch.__version__, triton_version, device_type])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def store_for(identity: str, device_type: str) -> Path | None:
    """The store's directory (made 0700 when missing), or None when the cache is off."""
    if not enabled():
        return None
    store = base_dir() / "worker-compile" / store_key(identity, device_type)
    store.mkdir(parents=True, exist_ok=True)
    for p in (store.parent.parent, store.parent, store):
        if p.stat().st_uid == os.getuid():
            p.chmod(0o700)
    os.utime(store)  # last used now: stores of identities nobody checks any more go (prune)
    prune(store.parent, keep=store)
    return store


def prune(stores: Path, keep: Path, now: float | None = None) -> list[str]:
    """Remove the stores not used for STALE_DAYS (an implementation edited since has a new identity: its
    old store would only grow the directory), then the least recently used others while all of them hold
    more than MAX_TOTAL_BYTES (each edit of a hostile implementation makes a new store of up to
    MAX_STORE_BYTES: a pull request's commits must not fill the runner's disk). Returns the names removed."""
    limit = (time.time() if now is None else now) - STALE_DAYS * 86400
    others = sorted((e for e in stores.iterdir() if e != keep and e.is_dir() and not e.is_symlink()),
                    key=lambda e: e.stat().st_mtime)
    sizes = {e: sum(p.stat().st_size for p in _files(e)) for e in others}
    total = sum(sizes.values()) + sum(p.stat().st_size for p in _files(keep))
    gone = []
    for entry in others:  # oldest first
        if entry.stat().st_mtime < limit or total > MAX_TOTAL_BYTES:
            shutil.rmtree(entry, ignore_errors=True)
            total -= sizes[entry]
            gone.append(entry.name)
    return gone


def _files(root: Path) -> list[Path]:
    """Regular files under root, never following a link (a link is left out, as is what it points into)."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                out.append(path)
    return out


def seed(store: Path, home: Path, uid: int | None, gid: int | None) -> int:
    """Copy the store into the worker's HOME; the copies belong to the worker's user. Returns the number
    of files copied."""
    count = 0
    for cache in CACHES:
        source = store / cache
        if not source.is_dir():
            continue
        groups = []
        for path in _files(source):
            if path.name.startswith(".part-"):  # another validator's harvest still writing it
                continue
            target = home / cache / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            count += 1
            if cache == ".triton" and path.name.startswith(GROUP_PREFIX):
                groups.append(target)
        for group in groups:  # after every file is in place: a group names only files that exist
            relocate_group(group)
        if uid is not None:
            for dirpath, _, filenames in os.walk(home / cache):
                os.chown(dirpath, uid, gid)
                for name in filenames:
                    os.chown(os.path.join(dirpath, name), uid, gid)
    return count


GROUP_PREFIX = "__grp__"  # Triton's index of a compiled kernel's files (triton/runtime/cache.py, get_group)
MAX_GROUP_BYTES = 1 << 16


def relocate_group(group: Path) -> bool:
    """Point a Triton group file at its own folder. Triton finds a compiled kernel through its group file,
    which lists the kernel's files by absolute path, and counts it missing when one of those paths does
    not exist. Every worker's cache lies under its own scratch HOME (a new temporary directory per
    session), so the paths a stored group names were the harvested worker's, gone by the next worker's
    start: every kernel compiled again in every worker, the store notwithstanding (round35b on the H200:
    12-21 compiles in each timed turn's fresh worker; docs/timing.md, "Fifteenth session"). A group's
    files are its siblings (Triton writes them into one folder per kernel hash), so each entry becomes the
    sibling of the same file name. The file is the implementation's writing: an entry whose file is not a
    regular file of the group's own folder leaves the group as it was (Triton then compiles, as before).
    Returns whether it was rewritten."""
    try:
        if group.is_symlink() or group.stat().st_size > MAX_GROUP_BYTES:
            return False
        text = relocated(group.read_bytes(), group.parent,
                         lambda base: (group.parent / base).is_file() and not (group.parent / base).is_symlink())
        if text is None:
            return False
        group.write_text(text)
        return True
    except OSError:
        return False


def relocated(data: bytes, folder: Path, present) -> str | None:
    """A group file's text with every child path moved into `folder` (the child's file name kept), or None
    when the text is not a group (too long, not JSON, no children) or names a file `present(name)` denies."""
    if len(data) > MAX_GROUP_BYTES:
        return None
    try:
        group = json.loads(data)
    except ValueError:
        return None
    children = group.get("child_paths") if isinstance(group, dict) else None
    if not isinstance(children, dict) or not children:
        return None
    moved = {}
    for name, old in children.items():  # name: Triton's key for the file; its file name may be shorter
        base = Path(old).name if isinstance(old, str) else ""
        if base in ("", ".", "..") or base.startswith(GROUP_PREFIX) or not present(base):
            return None
        moved[name] = str(folder / base)
    return json.dumps({**group, "child_paths": moved})


def _copy_at_most(src, out, size: int) -> None:
    left = size
    while left > 0:
        chunk = src.read(min(left, 1 << 20))
        if not chunk:
            break
        out.write(chunk)
        left -= len(chunk)


def harvest(home: Path, store: Path, known: set[str] | None = None) -> int:
    """Copy the files the worker added under its caches into the store (never replacing one there), within
    MAX_FILE_BYTES a file, MAX_STORE_BYTES and MAX_FILES a store. Returns the number of files added.

    It also runs while the worker lives (live_share.py: between two workloads), when the implementation may
    still be changing its HOME: the walk never follows a link (os.fwalk holds each directory open, and a
    file is opened relative to it with O_NOFOLLOW), so no swapped-in link makes this process copy a file
    the worker could not read. In each folder Triton's group file comes last: a stored group's files are
    in the store before it (live_share.top_up copies only complete kernels).

    `known`: the files (cache/relative path) this worker's store already holds, skipped without a look
    and added to as files are found or copied (a live worker is harvested after every workload), and the
    kernel folders ("cache/relative/") stored whole, not entered again."""
    known = set() if known is None else known
    sizes: list[int] = []  # the store's total and file count, read at the first file to copy

    def room() -> tuple[int, int]:
        if not sizes:
            have = _files(store)
            sizes.extend((sum(p.stat().st_size for p in have), len(have)))
        return sizes[0], sizes[1]

    added = 0
    for cache in CACHES:
        source = home / cache
        if not source.is_dir() or source.is_symlink():
            continue
        for dirpath, dirs, filenames, dir_fd in os.fwalk(source, follow_symlinks=False):
            relative = Path(dirpath).relative_to(source)
            dirs[:] = [d for d in dirs if f"{cache}/{relative / d}/" not in known]  # kernel folders done before
            for name in sorted(filenames, key=lambda n: (n.startswith(GROUP_PREFIX), n)):
                key = f"{cache}/{relative / name}"
                if key in known or name.startswith(".part-"):
                    continue
                target = store / cache / relative / name
                if target.exists():
                    known.add(key)
                    continue
                total, count = room()
                if count >= MAX_FILES:
                    continue
                try:
                    src_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
                except OSError:
                    continue
                with os.fdopen(src_fd, "rb") as src:
                    st = os.fstat(src.fileno())
                    # a hard link may name a file the worker could not read (a key the validator holds)
                    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                        continue
                    if st.st_size > MAX_FILE_BYTES or total + st.st_size > MAX_STORE_BYTES:
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
                    try:
                        with os.fdopen(fd, "wb") as out:
                            _copy_at_most(src, out, st.st_size)  # a file still growing stops at its size
                        os.replace(tmp, target)
                    except BaseException:
                        Path(tmp).unlink(missing_ok=True)
                        raise
                sizes[:] = [total + st.st_size, count + 1]
                known.add(key)
                added += 1
            if relative != Path(".") and any(n.startswith(GROUP_PREFIX) for n in filenames) and all(
                    f"{cache}/{relative / n}" in known for n in filenames):
                known.add(f"{cache}/{relative}/")  # a kernel folder stored whole: not walked again (Triton writes one once)
    return added
