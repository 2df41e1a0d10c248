"""Worker start-up before any implementation code runs, and how the implementation is imported.

- `harden_worker`: non-dumpable (another implementation's worker running as the same user cannot
  ptrace this one or read its memory), SIGKILL when the validator dies, and on the CPU glibc's
  allocator set with mallopt (freed heap memory is reused, so the allocator poison reaches fresh
  tensors) instead of MALLOC_* variables an implementation could recognise.
- `import_entry`: the implementation's folder (the session's copy of exactly the files its
  identity lists) is imported from source only: a path hook gives every directory inside it a
  finder with a loader that compiles the .py source each time and never reads or writes bytecode,
  so no .pyc (stale, unchecked-hash or planted) can run instead of the source a reviewer reads.
  Extension modules that are part of the folder (and so of its identity) stay importable.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.machinery as machinery
import os
import signal
import sys
import types

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
INT_MAX = 2**31 - 1


def harden_worker(malloc: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if malloc:
        # As MALLOC_MMAP_THRESHOLD_=large, MALLOC_TRIM_THRESHOLD_=large, MALLOC_TOP_PAD_=0 did.
        libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(INT_MAX))
        libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(INT_MAX))
        libc.mallopt(M_TOP_PAD, ctypes.c_int(0))
    sys.dont_write_bytecode = True


class SourceOnlyLoader(machinery.SourceFileLoader):
    """Compiles the source every time; never looks for, trusts or writes a .pyc."""

    def get_code(self, fullname: str) -> types.CodeType:
        return compile(self.get_data(self.path), self.path, "exec", dont_inherit=True)

    def set_data(self, path: str, data: bytes, *, _mode: int = 0o666) -> None:
        return None


def _inside(path: str, folder: str) -> bool:
    path = os.path.abspath(path)
    return path == folder or path.startswith(folder + os.sep)


def install_source_only(folder: str) -> None:
    folder = os.path.abspath(folder)

    def hook(path: str) -> machinery.FileFinder:
        if not _inside(path, folder):
            raise ImportError("not the implementation folder")
        return machinery.FileFinder(path, (SourceOnlyLoader, machinery.SOURCE_SUFFIXES),
                                    (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES))

    sys.path_hooks.insert(0, hook)
    for cached in [p for p in sys.path_importer_cache if _inside(p, folder)]:
        del sys.path_importer_cache[cached]


def import_entry(folder: str, package: str, module_name: str) -> types.ModuleType:
    """Import `module_name` of `folder` as `package.module_name` (the folder becomes a package, so
    relative imports work), and make the folder importable by top-level names too."""
    install_source_only(folder)
    pkg = types.ModuleType(package)
    pkg.__path__ = [folder]
    pkg.__package__ = package
    sys.modules[package] = pkg
    if folder not in sys.path:
        sys.path.append(folder)
    return importlib.import_module(f"{package}.{module_name}")
