"""Issue 32's forward-only: the logits GEMM with the row statistics in its epilogue (Triton), timed against
cuBLAS's GEMM alone. The logits are never written: each (BM x BN) tile leaves its rows' (max, sum exp) and,
where a row's target column falls in it, the target logit; a combine kernel makes lse and logp.

    python3 benchmarks/research/epilogue_gemm.py --batches 2 4 --out $OUT/epilogue-gemm.json  # CUDA
    TRITON_INTERPRET=1 python3 benchmarks/research/epilogue_gemm.py --check-small  # CPU: correctness, fp16
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: fused_peers
from fused_peers import load_folder  # noqa: E402


# The tile order is the folder's (implementations/triton-fused/epilogue.py), loaded as a package of its own.
_tile_of = importlib.import_module(load_folder("triton-fused", "epilogue_gemm_folder").__name__ + ".epilogue")._tile_of


@triton.jit
def _tile_epilogue(z, pid_m, pid_n, ids_ptr, pmax_ptr, psum_ptr, tgt_ptr, M, V, NT, BM: tl.constexpr,
                   BN: tl.constexpr):
    """A tile's scaled logits z [BM, BN] -> its rows' (max, sum of exp) at column pid_n of the partials, and the
    target logit of each row whose target column lies in the tile."""
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    row_ok = rows < M
    z = tl.where((cols < V)[None, :], z, float("-inf"))
    mx = tl.max(z, 1)
    s = tl.sum(tl.exp(z - mx[:, None]), 1)
    tl.store(pmax_ptr + rows * NT + pid_n, mx, mask=row_ok)
    tl.store(psum_ptr + rows * NT + pid_n, s, mask=row_ok)
    ids = tl.load(ids_ptr + rows, mask=row_ok, other=-1)
    t = tl.sum(tl.where(cols[None, :] == ids[:, None], z, 0.0), 1)
    mine = (ids >= pid_n * BN) & (ids < pid_n * BN + BN)
    tl.store(tgt_ptr + rows, t, mask=row_ok & mine)


@triton.jit
def _tile_stats_kernel(h_ptr, w_ptr, ids_ptr, pmax_ptr, psum_ptr, tgt_ptr, M, V, K, stride_h, stride_w, inv_temp,
                       NT, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                       WRITE_Z: tl.constexpr, z_ptr):
    pid_m, pid_n = _tile_of(tl.program_id(0), M, V, BM, BN, GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    a_ptrs = h_ptr + (rows % M)[:, None] * stride_h + ks[None, :]  # clamped: loads never leave the tensors,
    b_ptrs = w_ptr + (cols % V)[None, :] * stride_w + ks[:, None]  # the epilogue masks
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K // BK):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK
    z = acc * inv_temp
    if WRITE_Z:  # the plain GEMM (logits written), for Triton's own rate against cuBLAS
        tl.store(z_ptr + rows[:, None] * V + cols[None, :], z.to(z_ptr.dtype.element_ty),
                 mask=(rows < M)[:, None] & (cols[None, :] < V))
    else:
        _tile_epilogue(z, pid_m, pid_n, ids_ptr, pmax_ptr, psum_ptr, tgt_ptr, M, V, NT, BM, BN)


@triton.jit
def _tile_stats_tma_kernel(a_desc, b_desc, ids_ptr, pmax_ptr, psum_ptr, tgt_ptr, M, V, K, inv_temp, NT,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                           NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """Persistent: NUM_PROGRAMS programs walk the tiles; operands through TMA descriptors (Hopper's bulk
    copies), the same epilogue as `_tile_stats_kernel`."""
    tiles = tl.cdiv(M, BM) * tl.cdiv(V, BN)
    for tile in tl.range(tl.program_id(0), tiles, NUM_PROGRAMS, flatten=True, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_of(tile, M, V, BM, BN, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(0, tl.cdiv(K, BK)):
            a = a_desc.load([pid_m * BM, ki * BK])
            b = b_desc.load([pid_n * BN, ki * BK])
            acc = tl.dot(a, b.T, acc)
        _tile_epilogue(acc * inv_temp, pid_m, pid_n, ids_ptr, pmax_ptr, psum_ptr, tgt_ptr, M, V, NT, BM, BN)


@triton.jit
def _combine_kernel(pmax_ptr, psum_ptr, tgt_ptr, lse_ptr, logp_ptr, NT, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    ok = i < NT
    m = tl.load(pmax_ptr + r * NT + i, mask=ok, other=float("-inf"))
    s = tl.load(psum_ptr + r * NT + i, mask=ok, other=0.0)
    top = tl.max(m, 0)
    total = tl.sum(s * tl.exp(m - top), 0)
    lse = top + tl.log(total)
    tl.store(lse_ptr + r, lse)
    tl.store(logp_ptr + r, tl.load(tgt_ptr + r) - lse)


CONFIGS = [  # (BM, BN, BK, stages, warps)
    (128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (128, 128, 64, 4, 4), (128, 128, 64, 4, 8),
    (256, 128, 64, 3, 8), (128, 128, 128, 3, 8), (64, 256, 64, 4, 4),
]


def _partials(m: int, nt: int, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row and vocabulary tile the (max, sum of exp) pair, and per row the target logit."""
    pmax = torch.empty(m, nt, dtype=torch.float32, device=dev)
    return pmax, torch.empty_like(pmax), torch.empty(m, dtype=torch.float32, device=dev)


def _combined(pmax, psum, tgt) -> tuple[torch.Tensor, torch.Tensor]:
    """(lse, logp) per row from the tiles' partials."""
    m, nt = pmax.shape
    lse = torch.empty(m, dtype=torch.float32, device=pmax.device)
    logp = torch.empty_like(lse)
    _combine_kernel[(m,)](pmax, psum, tgt, lse, logp, nt, BLOCK=triton.next_power_of_2(nt))
    return lse, logp


def stats(h, w, ids, inv_temp, cfg, write_z=None):
    bm, bn, bk, stages, warps = cfg
    m, k = h.shape
    v = w.shape[0]
    assert k % bk == 0 and h.stride(1) == 1 and w.stride(1) == 1
    nt = triton.cdiv(v, bn)
    pmax, psum, tgt = _partials(m, nt, h.device)
    grid = (triton.cdiv(m, bm) * nt,)
    group_m = triton.cdiv(m, bm)  # every row block of one weight tile in a row: the weight is read once
    _tile_stats_kernel[grid](h, w, ids, pmax, psum, tgt, m, v, k, h.stride(0), w.stride(0), inv_temp, nt,
                             BM=bm, BN=bn, BK=bk, GROUP_M=group_m, WRITE_Z=write_z is not None,
                             z_ptr=write_z if write_z is not None else pmax, num_stages=stages, num_warps=warps)
    return None if write_z is not None else _combined(pmax, psum, tgt)


TMA_CONFIGS = [  # (BM, BN, BK, stages, warps, warp_specialize)
    (128, 256, 64, 3, 8, False), (128, 256, 64, 4, 8, False), (128, 128, 64, 4, 8, False),
    (128, 256, 64, 3, 8, True), (128, 128, 64, 4, 8, True), (128, 256, 64, 4, 8, True),
]


L2_ROWS_BYTES = 24 << 20  # the hidden rows a group of row blocks holds in L2 (the H100's and H200's L2: 50 MB)


def group_rows(m: int, bm: int, k: int, group_m: int | None = None) -> int:
    """Row blocks walked together for one weight tile: all of them while the hidden rows fit in half the L2
    (the weight is then read once); past that, as many as fit (the weight is read m / (group x bm) times)."""
    if group_m:
        return group_m
    return max(1, min(triton.cdiv(m, bm), L2_ROWS_BYTES // (bm * k * 2)))


def stats_tma(h, w, ids, inv_temp, cfg, programs=None, group_m=None):
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, stages, warps, ws = cfg
    m, k = h.shape
    v = w.shape[0]
    nt = triton.cdiv(v, bn)
    dev = h.device
    pmax, psum, tgt = _partials(m, nt, dev)
    a_desc = TensorDescriptor.from_tensor(h, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    tiles = triton.cdiv(m, bm) * nt
    if programs is None:
        programs = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    programs = min(programs, tiles)
    _tile_stats_tma_kernel[(programs,)](a_desc, b_desc, ids, pmax, psum, tgt, m, v, k, inv_temp, nt, BM=bm, BN=bn,
                                        BK=bk, GROUP_M=group_rows(m, bm, k, group_m), NUM_PROGRAMS=programs,
                                        WARP_SPECIALIZE=ws, num_stages=stages, num_warps=warps)
    return _combined(pmax, psum, tgt)


def reference(h, w, ids, inv_temp, rows):
    z = (h[rows].double() @ w.double().T) * inv_temp
    lse = torch.logsumexp(z, -1)
    return lse, z.gather(1, ids[rows, None].long())[:, 0] - lse


def check_small() -> None:
    torch.manual_seed(0)
    for m, v, k in ((40, 1003, 64), (7, 300, 128)):
        h = torch.randn(m, k).to(torch.float16)  # the interpreter mishandles bf16 dots
        w = torch.randn(v, k).to(torch.float16)
        ids = torch.randint(0, v, (m,), dtype=torch.int32)
        for cfg in ((16, 32, 32, 1, 4), (32, 64, 64, 1, 4)):
            if k % cfg[2]:
                continue
            lse, logp = stats(h, w, ids, 1 / 0.7, cfg)
            rl, rp = reference(h, w, ids, 1 / 0.7, torch.arange(m))
            err = max((lse.double() - rl).abs().max().item(), (logp.double() - rp).abs().max().item())
            print(f"m {m} v {v} k {k} cfg {cfg}: max |error| {err:.2e}")
            assert err < 1e-3, err
        lse, logp = stats_tma(h, w, ids, 1 / 0.7, (16, 32, 32, 1, 4, False), programs=3)
        rl, rp = reference(h, w, ids, 1 / 0.7, torch.arange(m))
        err = max((lse.double() - rl).abs().max().item(), (logp.double() - rp).abs().max().item())
        print(f"m {m} v {v} k {k} persistent TMA: max |error| {err:.2e}")
        assert err < 1e-3, err


def timed(fn, flush, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--check-small", action="store_true")
    ap.add_argument("--no-tma", action="store_true", help="only the pointer-based kernel (the first run's)")
    ap.add_argument("--only-tma", action="store_true", help="skip the pointer-based configs")
    ap.add_argument("--group-m", type=int, nargs="*", help="row blocks per group for the TMA kernel (default: "
                    "as many as fit L2_ROWS_BYTES)")
    ap.add_argument("--tma-configs", type=int, default=len(TMA_CONFIGS), help="the first N of TMA_CONFIGS")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.check_small:
        check_small()
        return
    dev = torch.device("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)
    v, k, inv_temp = 128256, 4096, 1 / 0.9
    w = (torch.randn(v, k, device=dev) * 0.02).to(torch.bfloat16)
    results = []
    for b in a.batches:
        m = b * 1024
        h = torch.randn(m, k, device=dev).to(torch.bfloat16)
        ids = torch.randint(0, v, (m,), device=dev, dtype=torch.int32)
        z = torch.empty(m, v, dtype=torch.bfloat16, device=dev)
        cublas = statistics.median(timed(lambda: torch.mm(h, w.T, out=z), flush, a.reps))
        row = {"batch": b, "cublas_ms": cublas, "configs": []}
        rows = torch.arange(0, m, max(1, m // 64), device=dev)
        rl, rp = reference(h, w, ids, inv_temp, rows)
        for cfg in CONFIGS if not a.only_tma else ():
            entry = {"cfg": cfg}
            try:
                lse, logp = stats(h, w, ids, inv_temp, cfg)
                entry["max_err"] = max((lse[rows].double() - rl).abs().max().item(),
                                       (logp[rows].double() - rp).abs().max().item())
                entry["stats_ms"] = statistics.median(timed(lambda: stats(h, w, ids, inv_temp, cfg), flush, a.reps))
                entry["gemm_ms"] = statistics.median(timed(lambda: stats(h, w, ids, inv_temp, cfg, z), flush, a.reps))
            except Exception as e:  # a config the compiler or the shared memory refuses
                entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            row["configs"].append(entry)
            print(json.dumps({"batch": b, **entry}), flush=True)
        tma_runs = [(cfg, g) for cfg in TMA_CONFIGS[: a.tma_configs] for g in (a.group_m or [None])]
        for cfg, g in tma_runs if not a.no_tma else ():
            entry = {"cfg": cfg, "kernel": "persistent-tma", "group_m": group_rows(m, cfg[0], k, g)}
            try:
                lse, logp = stats_tma(h, w, ids, inv_temp, cfg, group_m=g)
                entry["max_err"] = max((lse[rows].double() - rl).abs().max().item(),
                                       (logp[rows].double() - rp).abs().max().item())
                entry["stats_ms"] = statistics.median(timed(lambda: stats_tma(h, w, ids, inv_temp, cfg, group_m=g),
                                                            flush, a.reps))
            except Exception as e:
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["configs"].append(entry)
            print(json.dumps({"batch": b, **entry}), flush=True)
        results.append(row)
        tma = [c for c in row["configs"] if "stats_ms" in c and c.get("kernel")]
        if tma:
            best = min(tma, key=lambda c: c["stats_ms"])
            print(f"b{b}: persistent TMA epilogue stats best {best['stats_ms']:.3f} ms ({best['stats_ms'] / cublas:.3f}x "
                  f"cuBLAS, {best['cfg']}, group {best['group_m']}, max err {best['max_err']:.1e})", flush=True)
        ok = [c for c in row["configs"] if "stats_ms" in c and not c.get("kernel")]
        if ok:
            best = min(ok, key=lambda c: c["stats_ms"])
            bestg = min(ok, key=lambda c: c["gemm_ms"])
            print(f"b{b}: cuBLAS GEMM {cublas:.3f} ms; Triton GEMM best {bestg['gemm_ms']:.3f} ms "
                  f"({bestg['gemm_ms'] / cublas:.3f}x, {bestg['cfg']}); epilogue stats best {best['stats_ms']:.3f} ms "
                  f"({best['stats_ms'] / cublas:.3f}x, {best['cfg']}, max err {best['max_err']:.1e})", flush=True)
        h = z = None  # freed before the next batch
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
