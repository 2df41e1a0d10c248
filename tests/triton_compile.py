"""Triton's real compiler in a process of its own with HOME and TRITON_CACHE_DIR set, as a worker's are:
how many cubins it built tells whether the kernel came from the cache (tests of the compile store); and
`LEAVE_KERNEL`, what a test implementation runs to leave a kernel folder in its worker's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: The start of a test implementation's source: `leave_kernel(name)` writes a kernel folder into the worker's
#: Triton cache as Triton writes one at a first launch (its file, then the group file naming it).
LEAVE_KERNEL = '''
import json
import os


def leave_kernel(name):
    folder = os.path.join(os.environ["TRITON_CACHE_DIR"], name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "k.cubin"), "w") as f:
        f.write("compiled")
    with open(os.path.join(folder, "__grp__k.json"), "w") as f:
        json.dump({"child_paths": {"k.cubin": os.path.join(folder, "k.cubin")}}, f)
'''

KERNEL = textwrap.dedent('''
    import json, sys
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nvidia
    from triton.compiler import ASTSource

    built = []
    make_cubin = nvidia.CUDABackend.make_cubin
    nvidia.CUDABackend.make_cubin = lambda self, *a, **k: built.append(1) or make_cubin(self, *a, **k)

    @triton.jit
    def double(p, n, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        tl.store(p + o, tl.load(p + o, mask=o < n) * 2, mask=o < n)

    block = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    src = ASTSource(double, signature={"p": "*fp32", "n": "i32", "BLOCK": "constexpr"}, constexprs={"BLOCK": block})
    triton.compile(src, target=GPUTarget("cuda", 90, 32))  # for sm_90: no GPU needed, Triton's own ptxas
    print(json.dumps({"compiled": len(built)}))
''')


def compile_in(home: Path, script: Path, block: int = 128) -> dict:
    """Runs `script` (KERNEL, written by the test) with `home` as HOME; skips where Triton cannot compile."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "TRITON_CACHE_DIR": str(home / ".triton"), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, str(script), str(block)], capture_output=True, text=True, env=env,
                         timeout=300)
    if out.returncode != 0:
        pytest.skip(f"Triton cannot compile for sm_90 here: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
