"""Compiled kernels passed between the running workers of one implementation (slots sharing a GPU).

Why: the store (compile_cache.py) reached a worker only at its start and took its kernels only at its
end, and a slot keeps one worker for all its members. On a first run four slots' workers compiled 373
kernels, 131 of them again after another worker had compiled the same one, 110 of those five seconds or
more after that compile had ended (46.6 s of compiler time; docs/timing.md, "Fifteenth session").

How: between two workloads, while its worker waits for the next request, a slot harvests what the
worker's caches gained into the store (compile_cache.harvest) and copies in every stored Triton kernel its
worker's cache lacks (`top_up`). Triton looks a kernel up by its folder's group file at its first launch
of that specialisation, so a kernel copied in is found from the next workload on.

What the implementation can do with it: its HOME is its own to write while it runs, so every write here
goes through directory descriptors opened with O_NOFOLLOW, every file is created with O_EXCL, and a
kernel folder the worker already has is never touched: no link the worker plants makes this process
write outside the worker's cache. The kernels are its own identity's (the store is per identity), as
they were at a worker's start; what a worker leaves for another is judged there in full like anything else.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpo_conform.isolation.compile_cache import GROUP_PREFIX, MAX_FILE_BYTES, relocated

TRITON = ".triton"  # the worker's TRITON_CACHE_DIR under its HOME (session._PRIVATE_CACHES)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def top_up(store: Path, home: Path, uid: int | None, gid: int | None) -> int:
    """Copy into the worker's Triton cache each complete kernel folder of the store that it does not hold
    (files first, the group file last and already pointing at the copies). Returns the folders copied."""
    source = store / TRITON
    if not source.is_dir() or source.is_symlink():
        return 0
    try:
        root = _open_or_make(os.open(home, _DIR_FLAGS), TRITON, uid, gid)
    except OSError:
        return 0  # no HOME any more, or the worker made its cache a link: nothing is written
    copied = 0
    try:
        present = set(os.listdir(root))
        for entry in os.scandir(source):
            if entry.name in present or entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            files = kernel_files(Path(entry.path), home / TRITON / entry.name)
            if files is not None and _write_folder(root, entry.name, files, uid, gid):
                copied += 1
    finally:
        os.close(root)
    return copied


def kernel_files(folder: Path, target: Path) -> list[tuple[str, Path | bytes]] | None:
    """A stored kernel folder's files (their paths), then its group files' texts relocated to `target`; None
    when it is not complete (a harvest still writing it) or not a Triton kernel (no group, a group naming a
    missing file)."""
    files: dict[str, Path] = {}
    for entry in os.scandir(folder):
        if entry.name.startswith(".part-") or not entry.is_file(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_size > MAX_FILE_BYTES:
            return None
        files[entry.name] = Path(entry.path)
    groups = sorted(n for n in files if n.startswith(GROUP_PREFIX))
    if not groups:
        return None
    out: list[tuple[str, Path | bytes]] = [(n, p) for n, p in sorted(files.items()) if not n.startswith(GROUP_PREFIX)]
    for name in groups:
        text = relocated(files[name].read_bytes(), target, lambda base: base in files)
        if text is None:
            return None
        out.append((name, text.encode()))
    return out


def _open_or_make(parent: int, name: str, uid: int | None, gid: int | None) -> int:
    """`name` under the directory `parent` (closed here), made if missing, opened without following a link."""
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
            made = True
        except FileExistsError:
            made = False
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)
    if made and uid is not None:
        os.fchown(fd, uid, gid)
    return fd


def _write_folder(root: int, name: str, files: list[tuple[str, Path | bytes]], uid: int | None,
                  gid: int | None) -> bool:
    try:
        os.mkdir(name, 0o700, dir_fd=root)
    except FileExistsError:
        return False  # the worker compiled it meanwhile: its own stays
    fd = os.open(name, _DIR_FLAGS, dir_fd=root)
    try:
        if uid is not None:
            os.fchown(fd, uid, gid)
        for file_name, data in files:
            group = file_name.startswith(GROUP_PREFIX)
            # the group is what Triton looks for: it appears whole (a rename), after the files it names
            written = f".part-{file_name}" if group else file_name
            out = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            try:
                if uid is not None:
                    os.fchown(out, uid, gid)
                if isinstance(data, Path):  # a stored file (the store is the validator's: read as it stands)
                    with open(data, "rb") as src:
                        while chunk := src.read(1 << 20):
                            _write_all(out, chunk)
                else:
                    _write_all(out, data)
            finally:
                os.close(out)
            if group:
                os.rename(written, file_name, src_dir_fd=fd, dst_dir_fd=fd)
        return True
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]

