"""The float64 reference of grpo-fused-linear, chunked over rows and over the vocabulary.

Logits are never materialised whole. For a block of rows (flattened (b, t) positions) and a chunk
of the vocabulary, z = (hidden @ weight[chunk].T + bias[chunk]) / T; a running log-sum-exp over the
chunks gives lse[r], and the target logit is the dot product of hidden[r] with weight[c[r]], so

    logp[b, t] = (hidden[b, t] . weight[c] + bias[c]) / T - lse[b, t].

The GRPO terms on the [B, T] grid (ratio, clip, KL, normaliser) are the shared closed form
(`grpo_conform.ops.grpo_terms.token_terms`) fed these log-probs; g = dL/dlogp / T is then chained
through the linear layer chunk by chunk:

    d logits[r, v] = g[r] * (onehot(c[r])_v - softmax(z[r])_v)
    d hidden = d logits @ weight,  d weight = d logits.T @ hidden,  d bias = sum_r d logits[r, :].

KL through a reference weight: when the inputs hold `ref_weight` (and optionally `ref_hidden`,
`ref_bias`; absent, the policy's hidden states and no bias), the reference log-probs are computed
by the same chunked log-softmax from them (a second GEMM at the same temperature, no gradient) and
replace a given `ref_logprobs`.

Each gradient comes as chunks over its units (rows of hidden, rows of weight, entries of bias) with a
per-unit `scale` that bounds every |element| of the unit, from |d logits[r, v]| <= s[r] (onehot + p)
with s the shared terms' bound of |dL/dlogp| / T (see `GradientChunk`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Optional

import torch

from grpo_conform.ops.fused_linear import memo
from grpo_conform.ops.fused_linear.row_pass import RowPass, flat, logits, operand_roundoff, row_pass, spans
from grpo_conform.ops.grpo_terms import GrpoParameters, TokenTerms, token_terms

DEFAULT_BUDGET_BYTES = 256 * 2**20


@dataclass(frozen=True)
class GradientChunk:
    """Reference gradient of units [start, stop) of one gradient: `values` float64 [stop - start, width],
    `scale` float64 [stop - start] >= every |element| of its unit."""

    start: int
    stop: int
    values: torch.Tensor
    scale: torch.Tensor


@dataclass(frozen=True)
class Blocks:
    """Row blocks and vocabulary chunks; explicit sizes (tests) or derived from a memory budget."""

    rows: int
    vocab: int

    @classmethod
    def for_budget(cls, n_rows: int, vocab: int, hidden: int, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> "Blocks":
        # alive at once: a [rows, vchunk] logits block and ~3 temporaries of it, plus a [vchunk, hidden] slice
        vchunk = max(1, min(vocab, 4096))
        rows = max(1, budget_bytes // (4 * 8 * vchunk))
        vchunk = max(1, min(vchunk, budget_bytes // (4 * 8 * max(1, hidden))))
        return cls(min(rows, max(1, n_rows)), vchunk)


def _blocks(x, blocks: Optional[Blocks]) -> Blocks:
    h = x["hidden"]
    return blocks or Blocks.for_budget(h.numel() // h.shape[-1], x["weight"].shape[0], h.shape[-1])


def logprobs_and_lse(x: Mapping[str, torch.Tensor], p: GrpoParameters, blocks: Optional[Blocks] = None,
                     prefix: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """float64 logp [B, T] of the completion ids and the log-sum-exp lse [B*T] of z / T, from
    `{prefix}hidden` (falls back to `hidden`), `{prefix}weight`, `{prefix}bias`; once per input set,
    temperature and blocks (`row_stats`)."""
    rows = row_stats(x, p, blocks, prefix)
    return rows.logp, rows.lse


def row_stats(x: Mapping[str, torch.Tensor], p: GrpoParameters, blocks: Optional[Blocks] = None,
              prefix: str = "") -> RowPass:
    """The row pass of `x` (`row_pass.py`: logp, lse and the error model's row statistics for the operands'
    dtype) once per input set, temperature and blocks (`memo.py`: the loss, the error model and the
    gradients all start from it)."""
    blocks = _blocks(x, blocks)
    kept = memo.state(x)
    key = ("rows", prefix, float(p.temperature), blocks)
    if key not in kept:
        kept[key] = row_pass(x, p.temperature, blocks, prefix, u=operand_roundoff(x, prefix))
    return kept[key]


def generated_row_stats(x: Mapping[str, torch.Tensor], p: GrpoParameters) -> RowPass:
    """The input generator's row pass (it draws old and reference log-probs from logp): computed afresh, as
    `row_stats` would compute it, never memoised here; `keep_generated` hands it to the judge."""
    blocks = _blocks(x, None)
    return row_pass(x, p.temperature, blocks, u=operand_roundoff(x))


def keep_generated(x: Mapping[str, torch.Tensor], temperature: float, rows: RowPass) -> None:
    """Keep for input set `x` the row pass the generator made of exactly its values. Only for tensors no
    implementation can write (the engine's pristine copies, or fresh tensors it copied into them), written
    in full before the generator read them: an implementation's process maps the shared buffers and may
    write them at any time, so nothing computed from those may stand for the judge's reference."""
    memo.state(x).setdefault(("rows", "", float(temperature), _blocks(x, None)), rows)


def terms(x: Mapping[str, torch.Tensor], p: GrpoParameters, blocks: Optional[Blocks] = None
          ) -> tuple[TokenTerms, torch.Tensor]:
    """The shared GRPO terms fed the policy's log-probs (and, with `ref_weight`, reference log-probs
    through the reference weight), and the policy's lse [B*T]."""
    logp, lse = logprobs_and_lse(x, p, blocks)
    if "ref_weight" in x:
        ref, _ = logprobs_and_lse(x, p, blocks, prefix="ref_")
        x = {**x, "ref_logprobs": ref}
    return token_terms(x, p, logp), lse


def reference_loss(x: Mapping[str, torch.Tensor], p: GrpoParameters, blocks: Optional[Blocks] = None) -> float:
    return float(terms(x, p, blocks)[0].loss.sum())


def _dlogits(h, w, b, v0, v1, c, g, s, lse, p):
    """d logits of rows x vocab chunk [v0, v1), its elementwise bound s * (onehot + softmax), and the softmax."""
    prob = torch.exp(logits(h, w, b, v0, v1, p.temperature, "d-logits") - lse[:, None])
    onehot = torch.zeros_like(prob)
    inside = (c >= v0) & (c < v1)
    rows = torch.nonzero(inside).squeeze(-1)
    onehot[rows, c[rows] - v0] = 1.0
    return g[:, None] * (onehot - prob), s[:, None] * (onehot + prob), prob


def reference_gradients(x: Mapping[str, torch.Tensor], p: GrpoParameters, blocks: Optional[Blocks] = None,
                        ) -> dict[str, Iterator[GradientChunk]]:
    """{"weight": chunks over vocabulary rows, "bias" (when given): chunks over vocabulary entries,
    "hidden": chunks over rows (b, t)}, lazy, in that order: iterated in it, one pass makes all three
    (`_Sweep`: each chunk of d logits once, three float64 GEMM passes in all, not five); a gradient
    asked for before the weight's pass has ended is computed on its own (the same values, bitwise)."""
    blocks = _blocks(x, blocks)
    tt, lse = terms(x, p, blocks)
    g = (tt.dlogp / p.temperature).reshape(-1)
    s = (tt.scale / p.temperature).reshape(-1)
    sweep = _Sweep(x, p, blocks, g, s, lse)
    out = {"weight": sweep.weight()}
    if x.get("bias") is not None:
        out["bias"] = sweep.kept("bias", lambda: _weight_chunks(x, p, blocks, g, s, lse, False))
    out["hidden"] = sweep.kept("hidden", lambda: _hidden_chunks(x, p, blocks, g, s, lse))
    return out


class _Sweep:
    """One pass over vocabulary chunks (outer) and row blocks (inner) that yields d weight chunk by chunk
    and meanwhile keeps d bias [V] and d hidden [N, H] (float64: the size of the hidden states, not of
    the weight). Every product and every sum is the one the standalone loops make, in the same order
    (d hidden of a row block sums its vocabulary chunks in ascending order in both), so the values are
    bitwise those of `_hidden_chunks` and `_weight_chunks`. Error models of the same inputs and
    parameters waiting for their unit sums (`tolerance.UnitSums`) take its probabilities on the way."""

    def __init__(self, x, p, blocks, g, s, lse) -> None:
        self.args = (x, p, blocks, g, s, lse)
        self.done: dict[str, list[GradientChunk]] = {}

    def weight(self) -> Iterator[GradientChunk]:
        x, p, blocks, g, s, lse = self.args
        h_all, w, b = flat(x)
        ids = x["completion_ids"].reshape(-1).to(torch.int64)
        wmax = w.abs().amax(-1).to(torch.float64)
        n, width = h_all.shape
        dev = h_all.device
        dh = torch.zeros(n, width, dtype=torch.float64, device=dev)
        dh_bound = torch.zeros(n, dtype=torch.float64, device=dev)
        bias: list[GradientChunk] = []
        # error models of these inputs and parameters whose unit sums are not made yet (tolerance.UnitSums):
        # they take this sweep's probabilities
        sums = [u for u in memo.state(x).get(("unit-sums", repr(p), blocks), ()) if u.start(h_all, ids, wmax, blocks)]
        for v0, v1 in spans(w.shape[0], blocks.vocab):
            acc = torch.zeros(v1 - v0, width, dtype=torch.float64, device=dev)
            bound = torch.zeros(v1 - v0, dtype=torch.float64, device=dev)
            acc_b = torch.zeros(v1 - v0, 1, dtype=torch.float64, device=dev)
            bound_b = torch.zeros(v1 - v0, dtype=torch.float64, device=dev)
            for r0, r1 in spans(n, blocks.rows):
                h = h_all[r0:r1].to(torch.float64)
                dz, dz_bound, prob = _dlogits(h, w, b, v0, v1, ids[r0:r1], g[r0:r1], s[r0:r1], lse[r0:r1], p)
                for u in sums:
                    u.add(r0, r1, v0, v1, h, ids[r0:r1], wmax, prob)
                memo.count("d-weight", 2 * (r1 - r0) * width * (v1 - v0))
                acc += dz.T @ h
                bound += dz_bound.T @ h.abs().amax(-1)
                acc_b[:, 0] += dz.sum(0)
                bound_b += dz_bound.sum(0)
                memo.count("d-hidden", 2 * (r1 - r0) * width * (v1 - v0))
                dh[r0:r1] += dz @ w[v0:v1].to(torch.float64)
                dh_bound[r0:r1] += dz_bound @ wmax[v0:v1]
            bias.append(GradientChunk(v0, v1, acc_b, bound_b))
            for u in sums:
                u.chunk_done(v1)
            yield GradientChunk(v0, v1, acc, bound)
        for u in sums:
            u.finish()
        self.done["bias"] = bias
        self.done["hidden"] = [GradientChunk(r0, r1, dh[r0:r1], dh_bound[r0:r1]) for r0, r1 in spans(n, blocks.rows)]

    def kept(self, name: str, alone) -> Iterator[GradientChunk]:
        """`name`'s chunks from the weight's finished pass; computed by `alone()` where that pass has
        not run to its end when they are first asked for."""
        if name not in self.done:
            yield from alone()
            return
        yield from self.done[name]


def _hidden_chunks(x, p, blocks, g, s, lse) -> Iterator[GradientChunk]:
    h_all, w, b = flat(x)
    ids = x["completion_ids"].reshape(-1).to(torch.int64)
    wmax = w.abs().amax(-1).to(torch.float64)  # |weight[v, k]| <= wmax[v] (abs and max are exact in any dtype)
    for r0, r1 in spans(h_all.shape[0], blocks.rows):
        h = h_all[r0:r1].to(torch.float64)
        dh = torch.zeros_like(h)
        bound = torch.zeros(r1 - r0, dtype=torch.float64, device=h.device)
        for v0, v1 in spans(w.shape[0], blocks.vocab):
            dz, dz_bound, _ = _dlogits(h, w, b, v0, v1, ids[r0:r1], g[r0:r1], s[r0:r1], lse[r0:r1], p)
            memo.count("d-hidden", 2 * (r1 - r0) * h.shape[1] * (v1 - v0))
            dh += dz @ w[v0:v1].to(torch.float64)
            bound += dz_bound @ wmax[v0:v1]
        yield GradientChunk(r0, r1, dh, bound)


def _weight_chunks(x, p, blocks, g, s, lse, weight: bool) -> Iterator[GradientChunk]:
    """d weight (`weight` True) or d bias, over vocabulary chunks, accumulated over row blocks."""
    h_all, w, b = flat(x)
    ids = x["completion_ids"].reshape(-1).to(torch.int64)
    for v0, v1 in spans(w.shape[0], blocks.vocab):
        width = h_all.shape[1] if weight else 1
        acc = torch.zeros(v1 - v0, width, dtype=torch.float64, device=h_all.device)
        bound = torch.zeros(v1 - v0, dtype=torch.float64, device=h_all.device)
        for r0, r1 in spans(h_all.shape[0], blocks.rows):
            h = h_all[r0:r1].to(torch.float64)
            dz, dz_bound, _ = _dlogits(h, w, b, v0, v1, ids[r0:r1], g[r0:r1], s[r0:r1], lse[r0:r1], p)
            if weight:
                memo.count("d-weight", 2 * (r1 - r0) * h.shape[1] * (v1 - v0))
                acc += dz.T @ h
                bound += dz_bound.T @ h.abs().amax(-1)  # |hidden[r, k]| <= max_k |hidden[r, k]|
            else:
                acc[:, 0] += dz.sum(0)
                bound += dz_bound.sum(0)
        yield GradientChunk(v0, v1, acc, bound)


def dense_gradients(x: Mapping[str, torch.Tensor], p: GrpoParameters, blocks: Optional[Blocks] = None
                    ) -> dict[str, torch.Tensor]:
    """Every gradient as one tensor of its input's shape (small inputs and tests only)."""
    out = {}
    for name, chunks in reference_gradients(x, p, blocks).items():
        out[name] = torch.cat([c.values for c in chunks]).reshape(x[name].shape)
    return out
