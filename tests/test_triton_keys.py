"""Triton cache keys independent of launch order in a worker (grpo_conform/isolation/triton_keys.py):
the H200's Triton 3.6 gave a kernel one of two keys depending on which kernel the process launched
first, so a timed turn's fresh worker compiled again what the compile store held."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from grpo_conform.isolation import triton_keys


def _functions(finder_cls):
    """Two kernels sharing a helper that reads a constexpr global, hashed by `finder_cls` as Triton
    hashes JIT functions (a callee's key and globals enter the caller's key)."""

    class Fn:
        def __init__(self, name, own_globals, callees=()):
            self.name, self.own, self.callees, self._key, self.used_global_vals = name, own_globals, callees, None, {}

        @property
        def cache_key(self):
            if self._key is None:
                finder = finder_cls()
                for callee in self.callees:
                    finder._update_hash(callee)
                finder.used.update(self.own)
                self.used_global_vals = dict(finder.used)
                self._key = f"{self.name}|{','.join(finder.parts)}|{sorted(self.used_global_vals.items())}"
            return self._key

    helper = Fn("helper", {"PAD": -1e30})
    return Fn("stats", {}, (helper,)), Fn("member", {}, (helper,))


class OldFinder:
    """Triton before triton-lang/triton#10494: the callee's globals merged before its key is computed."""

    def __init__(self):
        self.used, self.parts = {}, []

    def _update_hash(self, func):
        self.used.update(func.used_global_vals)
        self.parts.append(func.cache_key)


def _keys(finder_cls, first: str) -> dict[str, str]:
    stats, member = _functions(finder_cls)
    order = (stats, member) if first == "stats" else (member, stats)
    return {f.name: f.cache_key for f in order}


def test_the_old_merge_order_makes_a_key_depend_on_which_kernel_came_first():
    assert _keys(OldFinder, "stats")["member"] != _keys(OldFinder, "member")["member"]


def test_wrapped_the_keys_are_the_same_whichever_kernel_comes_first():
    class Finder(OldFinder):
        pass

    assert triton_keys.wrap(Finder) and triton_keys.wrap(Finder)  # idempotent: one wrapper
    assert getattr(Finder._update_hash, triton_keys.MARK)
    assert _keys(Finder, "stats") == _keys(Finder, "member")


SCRIPT = textwrap.dedent('''
    import sys
    import triton
    import triton.language as tl
    from grpo_conform.isolation import triton_keys

    PAD = tl.constexpr(-1.0e30)

    @triton.jit
    def helper(x):
        return x + PAD

    @triton.jit
    def stats(p):
        tl.store(p, helper(tl.load(p)))

    @triton.jit
    def member(p):
        tl.store(p, helper(tl.load(p)) * 2)

    assert triton_keys.steady()
    first, second = (stats, member) if sys.argv[1] == "stats" else (member, stats)
    print(first.cache_key, second.cache_key) if sys.argv[1] == "stats" else print(second.cache_key, first.cache_key)
''')


def test_real_triton_keys_agree_across_processes_and_launch_orders(tmp_path):
    pytest.importorskip("triton")
    script = tmp_path / "keys.py"
    script.write_text(SCRIPT)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(p for p in sys.path if p), "TRITON_INTERPRET": "0"}
    out = [subprocess.run([sys.executable, str(script), first], capture_output=True, text=True, env=env, timeout=120)
           for first in ("stats", "member")]
    assert all(o.returncode == 0 for o in out), [o.stderr[-2000:] for o in out]
    assert out[0].stdout.split() == out[1].stdout.split()
