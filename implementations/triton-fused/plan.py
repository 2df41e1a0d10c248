"""The launcher: one `FusedPlan` per (shapes, dtypes, device, member semantics, settings), built once;
`FusedPlan.run` does one call, chunk by chunk (docs/fused-kernel.md):

  per-sequence weights from the mask (before any GEMM)
  for each chunk of rows [r0, r1):
      (reference weight) ref logits = ref_hidden_c @ ref_weight.T -> the reference log-probs
      x = hidden_c @ weight.T (+ bias)                    cuBLAS, fp32 accumulation, x in the weight dtype
      loss terms; d loss / d logits written over x        Triton (kernels.py)
      d hidden_c = x @ weight                             cuBLAS
      d weight += x.T @ hidden_c  (float32 sums)          "halves"/"fp32" (accumulator.py), or "hold": x stays,
                                                          one GEMM after the loop (with logits in W's dtype:
                                                          one chunk of all rows)
  loss = sum of the per-token terms (fixed order)

Without gradients only the logits GEMM and the loss kernel run (members whose loss does not read the
logits: not even the GEMM); up to forward_epilogue_rows rows the GEMM is epilogue.py's, which leaves each
row's statistics and target logit instead of the logits. The gradients carry the upstream scalar the plan predicts (`c_pred`, the
d loss the last backward received, 1 at first) folded into d logits; backward rescales only when the
real d loss differs (function.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton

from . import epilogue, kernels, sweep
from .accumulator import Fp32, Halves, accumulate_fp32, accumulator, interpreting
from .semantics import FusedSettings, Semantics


@dataclass(frozen=True)
class Inputs:
    """One call's tensors, flattened: hidden [N, H], ids/old/ref/mask [N], advantages [B] (float32)."""

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    ids: torch.Tensor
    adv: torch.Tensor
    old: Optional[torch.Tensor]
    ref: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]
    ref_weight: Optional[torch.Tensor] = None
    ref_hidden: Optional[torch.Tensor] = None
    ref_bias: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class Result:
    loss: torch.Tensor
    grads: tuple  # (d hidden [N, H] or None, d weight or None, d bias or None)
    c_used: Optional[torch.Tensor]  # the upstream scalar folded into the gradients (float32 [1])


class FusedPlan:
    def __init__(self, batch: int, seq: int, hidden: int, vocab: int, dtype: torch.dtype, device: torch.device,
                 sem: Semantics, settings: FusedSettings):
        self.batch, self.seq, self.hidden, self.vocab = batch, seq, hidden, vocab
        self.tokens = batch * seq
        self.dtype, self.device, self.sem, self.settings = dtype, device, sem, settings
        cpu = device.type != "cuda" or interpreting()
        block = min(settings.block, triton.next_power_of_2(vocab))
        if cpu or settings.split_elems <= 0:
            piece = triton.cdiv(vocab, block) * block  # one program per row (the interpreter runs them in turn)
        else:
            piece = min(triton.cdiv(settings.split_elems, block) * block, triton.cdiv(vocab, block) * block)
        self.piece, self.block = piece, block
        self.split = triton.cdiv(vocab, piece)
        self.warps = 4 if cpu else settings.num_warps
        self.hints = not cpu
        # the token-level loss kernel's first sweep: where d logits follow, one block in flight and the
        # piece kept in L2 for the gradient's sweep; forward-only (its one pass over the logits), blocks
        # pipelined with per-lane sums and no L2 hint (FusedSettings.forward_sweep)
        self.grad_sweep = dict(BLOCK=block, STAGES=1, VECTOR=False, HINTS=self.hints)
        self.forward_sweep = self.grad_sweep
        if settings.forward_sweep in ("pipelined", "staged"):  # staged: pipelined where staging cannot run
            self.forward_sweep = dict(BLOCK=min(settings.forward_block, triton.next_power_of_2(vocab)),
                                      STAGES=settings.forward_stages, VECTOR=True, HINTS=False)
        # one program per row never touches the arrival counters or the partials: one pair for every call
        # (no zeroing launch per chunk)
        self.no_counts = torch.zeros(1, dtype=torch.int32, device=device)
        self.no_part = torch.empty(1, dtype=torch.float32, device=device)
        self.c_pred = torch.ones(1, dtype=torch.float32, device=device)
        self.weight_grad = self._strategy()
        # rows per chunk: of a call that forms gradients (per strategy: halves runs larger chunks), of a
        # forward-only call (no gradient buffers; FusedSettings.rows_forward)
        self.chunk = self._rows(settings.rows(self.weight_grad, hidden))
        self.forward_chunk = self._rows(settings.rows_forward())
        self.accumulate_path = None  # set by the first fp32 accumulation (the benchmark prints it)
        # forward-only calls on CUDA: the staged sweep takes each row's (max, ln S) (sweep.py); None where it
        # cannot run (`staged_off` says why)
        forward_dtype = torch.float32 if settings.logits == "float32" else dtype
        self.staged_off = sweep.why_not(device, vocab, forward_dtype, settings)
        self.staged = None if self.staged_off else sweep.StagedStats(self.forward_chunk, vocab, forward_dtype,
                                                                     device, settings, sem.inv_temp)
        # forward-only calls of up to forward_epilogue_rows rows: the GEMM leaves each row's statistics and
        # target logit, nothing else runs over the logits (epilogue.py); None where it cannot (`epilogue_off`)
        self.epilogue_off = epilogue.why_not(device, self.tokens, hidden, dtype, settings)
        self.epilogue = None if self.epilogue_off else epilogue.EpilogueStats(
            max(1, self.tokens), vocab, hidden, device, settings, sem.inv_temp, sem.inv_lo)

    def _rows(self, rows: int) -> int:
        """A chunk's rows: whole sequences for sequence-level members (a sequence's ratio needs all its
        tokens), at least one, at most every row."""
        if self.sem.sequence:
            rows = max(1, rows // max(1, self.seq)) * max(1, self.seq)
        return min(max(1, rows), max(1, self.tokens))

    def _strategy(self) -> str:
        """auto: hold every row's d logits while they take no more bytes than one float32 copy of the weight
        (N V s <= 4 V H: N <= 2 H rows in bf16; the fastest path, no accumulator traffic), else the halves
        accumulator (2 V H + C V s). So the gradient path never holds more than ~4 V H bytes, at any batch
        (docs/fused-kernel.md, "Weight gradient")."""
        s = self.settings.weight_grad
        if self.dtype == torch.float32:
            return "fp32"  # the returned gradient is the accumulator: nothing extra
        halves_ok = Halves.fits(self.vocab, self.hidden, self.dtype)  # (2-byte dtypes at even H or V)
        if s != "auto":
            return "fp32" if s == "halves" and not halves_ok else s
        hold = self.tokens * self.vocab * self._size()
        if hold <= 4 * self.vocab * self.hidden:
            return "hold"
        if halves_ok:
            return "halves"
        return "hold" if hold <= self.extra_bytes("fp32") else "fp32"

    def _size(self) -> int:
        return torch.tensor([], dtype=self.dtype).element_size()

    def extra_bytes(self, strategy: Optional[str] = None) -> int:
        """Bytes the gradient path holds beyond inputs and outputs (the dominant terms)."""
        size, strategy = self._size(), strategy or self.weight_grad
        chunk = self._rows(self.settings.rows(strategy, self.hidden)) * self.vocab * size  # that strategy's chunk
        if strategy == "hold":
            return self.tokens * self.vocab * size
        if strategy == "halves":
            return Halves.extra_bytes(self.vocab, self.hidden) + chunk
        return Fp32.extra_bytes(self.vocab, self.hidden, self.dtype) + chunk

    # -- small pieces ------------------------------------------------------------------------------------
    def _weights(self, x: Inputs) -> torch.Tensor:
        """Per-sequence weights [B] (float32) where the loss type normalises by mask counts."""
        if self.sem.norm == 0:
            return x.adv  # never read
        n_b = (x.mask.view(self.batch, self.seq) != 0).sum(1).to(torch.float32)
        if self.sem.norm == 1:
            return (1.0 / (self.batch * n_b.clamp_min(1.0))).contiguous()
        return (1.0 / n_b.sum().clamp_min(1.0)).expand(self.batch).contiguous()

    def _logits(self, out: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> None:
        if out.dtype != w.dtype:  # float32 logits from operands in the weight's dtype
            if out.is_cuda:
                torch.mm(h, w.t(), out_dtype=out.dtype, out=out)
            else:
                torch.mm(h.to(out.dtype), w.t().to(out.dtype), out=out)
            if b is not None:
                out += b
        elif b is None:
            torch.mm(h, w.t(), out=out)
        else:
            torch.addmm(b, h, w.t(), out=out)

    def _ref_logp(self, x: Inputs, buf: torch.Tensor, r0: int, r1: int, ref_lp: torch.Tensor) -> None:
        """The reference model's log-probs of rows [r0, r1) through its own lm_head, into ref_lp."""
        h = (x.hidden if x.ref_hidden is None else x.ref_hidden)[r0:r1]
        self._logits(buf, h, x.ref_weight, x.ref_bias)
        kernels._stats_kernel[(r1 - r0,)](buf, x.ids, x.adv, x.adv, x.mask if x.mask is not None else x.ids, ref_lp,
                                          r0, self.tokens, self.vocab, buf.stride(0), self.sem.inv_temp,
                                          self.sem.inv_lo, BLOCK=self.block, HAS_OLD=False, HAS_KL=False,
                                          HAS_MASK=self.sem.has_mask, LOGP_ONLY=True, GIVEN=False, TARGET_GIVEN=False,
                                          num_warps=self.warps)

    def _staged_stats(self, buf, x: Inputs, r0: int, st: torch.Tensor, stride: int) -> bool:
        """A forward-only chunk's (max, ln S) per live row by the staged sweep, into st[r] and st[stride + r];
        False where it cannot run (the loss kernel then sweeps itself)."""
        if self.staged is None:
            return False
        if self.staged.run(buf, x.mask, st, r0, stride):
            return True
        self.staged, self.staged_off = None, sweep.DISABLED[-1]
        return False

    def _loss_rows(self, buf, gbuf, x: Inputs, ref, wb, c, loss_tok, ws, r0: int, r1: int, write_grad: bool) -> None:
        """Loss terms of rows [r0, r1) of the logits in buf (and, write_grad, d logits into gbuf: buf itself
        or a buffer in the weight's dtype)."""
        s, n = self.sem, r1 - r0
        mask = x.mask if x.mask is not None else x.ids
        old = x.old if x.old is not None else x.adv
        ref = ref if ref is not None else x.adv
        c = c if c is not None else x.adv  # read only when the gradient is written
        if not s.sequence:
            counts, part = self.no_counts, self.no_part
            if self.split > 1:  # zeroed per launch: the row's pieces count their arrivals
                counts = torch.zeros(n, dtype=torch.int32, device=self.device)
                part = torch.empty(2 * n * self.split, dtype=torch.float32, device=self.device)
            given = False
            if s.needs_logp and not write_grad:  # the staged sweep's (max, ln S) in `part` (split is 1 here)
                stats = torch.empty(2 * n, dtype=torch.float32, device=self.device)
                given = self._staged_stats(buf, x, r0, stats, n)
                part = stats if given else part
            first = self.grad_sweep if write_grad else self.forward_sweep
            kernels._rows_kernel[(n * self.split,)](
                buf, gbuf, x.ids, x.adv, old, ref, mask, wb, c, loss_tok, part, counts, r0, n, self.seq, self.vocab,
                buf.stride(0), gbuf.stride(0), *s.scalars(), CHUNK=self.piece, SPLIT=self.split,
                SPLIT_P2=triton.next_power_of_2(self.split), **s.switches(), NEEDS_LOGP=s.needs_logp or write_grad,
                WRITE_GRAD=write_grad, **first, GIVEN=given, TARGET_GIVEN=False,
                num_warps=self.warps)
            return
        given = not write_grad and self._staged_stats(buf, x, r0, ws[r0:], self.tokens)  # ws sections 0 and 1
        kernels._stats_kernel[(n,)](buf, x.ids, old, ref, mask, ws, r0, self.tokens, self.vocab, buf.stride(0),
                                    s.inv_temp, s.inv_lo, BLOCK=self.block, HAS_OLD=True, HAS_KL=s.has_kl,
                                    HAS_MASK=s.has_mask, LOGP_ONLY=False, GIVEN=given, TARGET_GIVEN=False,
                                    num_warps=self.warps)
        kernels._sequence_kernel[(n // self.seq,)](
            ws, x.adv, mask, wb, loss_tok, r0 // self.seq, self.seq, self.tokens, s.inv_temp, s.eps_low, s.eps_high,
            s.delta, s.beta, s.w_const, HAS_KL=s.has_kl, HAS_MASK=s.has_mask, HAS_DELTA=s.has_delta,
            PER_SEQ_W=s.norm != 0, BLOCK_T=min(1024, triton.next_power_of_2(self.seq)), num_warps=4)
        if write_grad:
            kernels._coef_grad_kernel[(n * self.split,)](
                buf, gbuf, x.ids, ws, c, r0, self.tokens, self.vocab, buf.stride(0), gbuf.stride(0), s.inv_temp,
                CHUNK=self.piece, BLOCK=self.block, SPLIT=self.split, num_warps=self.warps)

    def _epilogue_forward(self, x: Inputs, wb: torch.Tensor, loss_tok: torch.Tensor) -> None:
        """A forward-only call through epilogue.py: each GEMM (the reference weight's first) leaves the rows'
        (max, ln S, target logit), or the reference log-probs; the loss kernels read those (GIVEN +
        TARGET_GIVEN) and never a logit."""
        s, n, dev = self.sem, self.tokens, self.device
        ref = x.ref if x.ref is not None else x.adv
        if x.ref_weight is not None:
            ref = torch.empty(n, dtype=torch.float32, device=dev)
            h = x.hidden if x.ref_hidden is None else x.ref_hidden
            self.epilogue.run(h, x.ref_weight, x.ref_bias, x.ids, x.mask, ref, n, logp_only=True)
        mask = x.mask if x.mask is not None else x.ids
        old = x.old if x.old is not None else x.adv
        if not s.sequence:
            part = torch.empty(3 * n, dtype=torch.float32, device=dev)
            self.epilogue.run(x.hidden, x.weight, x.bias, x.ids, x.mask, part, n, logp_only=False)
            kernels._rows_kernel[(n,)](
                x.adv, x.adv, x.ids, x.adv, old, ref, mask, wb, x.adv, loss_tok, part, self.no_counts, 0, n, self.seq,
                self.vocab, 0, 0, *s.scalars(), CHUNK=self.piece, SPLIT=1, SPLIT_P2=1, **s.switches(), NEEDS_LOGP=True,
                WRITE_GRAD=False, **self.forward_sweep, GIVEN=True, TARGET_GIVEN=True, num_warps=self.warps)
            return
        ws = torch.empty(6 * n, dtype=torch.float32, device=dev)  # sections 0-2: max, ln S, target logit
        self.epilogue.run(x.hidden, x.weight, x.bias, x.ids, x.mask, ws, n, logp_only=False)
        kernels._stats_kernel[(n,)](x.adv, x.ids, old, ref, mask, ws, 0, n, self.vocab, 0, s.inv_temp, s.inv_lo,
                                    BLOCK=self.block, HAS_OLD=True, HAS_KL=s.has_kl, HAS_MASK=s.has_mask,
                                    LOGP_ONLY=False, GIVEN=True, TARGET_GIVEN=True, num_warps=self.warps)
        kernels._sequence_kernel[(n // self.seq,)](
            ws, x.adv, mask, wb, loss_tok, 0, self.seq, n, s.inv_temp, s.eps_low, s.eps_high, s.delta, s.beta,
            s.w_const, HAS_KL=s.has_kl, HAS_MASK=s.has_mask, HAS_DELTA=s.has_delta, PER_SEQ_W=s.norm != 0,
            BLOCK_T=min(1024, triton.next_power_of_2(self.seq)), num_warps=4)

    # -- one call ----------------------------------------------------------------------------------------
    def run(self, x: Inputs, need: tuple = (False, False, False), c: Optional[torch.Tensor] = None) -> Result:
        """need: which of (d hidden, d weight, d bias) to form; c: the upstream scalar to fold in (float32
        [1]; default the prediction)."""
        s, n_tok, dev = self.sem, self.tokens, self.device
        grads_needed = any(need)
        loss_tok = torch.empty(max(1, n_tok), dtype=torch.float32, device=dev)
        wb = self._weights(x)
        if not grads_needed and not s.needs_logp and x.ref_weight is None:
            if n_tok:  # the loss does not read the logits: no GEMM at all
                self._loss_rows(x.adv, x.adv, x, None, wb, x.adv, loss_tok, None, 0, n_tok, write_grad=False)
            return Result(loss_tok[:n_tok].sum(), (None, None, None), None)
        if not grads_needed and n_tok and self.epilogue is not None and all(
                self.epilogue.usable(h, w) for h, w in ((x.hidden, x.weight), (x.ref_hidden, x.ref_weight))):
            self._epilogue_forward(x, wb, loss_tok)
            return Result(loss_tok[:n_tok].sum(), (None, None, None), None)
        c_used = (self.c_pred.clone() if c is None else c.to(torch.float32).reshape(1).clone()) if grads_needed else None
        ws = torch.empty(6 * n_tok, dtype=torch.float32, device=dev) if s.sequence else loss_tok
        ref_lp = torch.empty(n_tok, dtype=torch.float32, device=dev) if x.ref_weight is not None else x.ref
        strategy = self.weight_grad if need[1] or need[2] else "fp32"
        hold = grads_needed and strategy == "hold"
        wide = self.settings.logits == "float32" and self.dtype != torch.float32
        rows = self.chunk if grads_needed else self.forward_chunk
        lbuf = torch.empty(rows, self.vocab, dtype=torch.float32, device=dev) if wide else None
        dlogits = None  # d logits (over the logits themselves unless they are float32)
        if grads_needed or not wide:
            dlogits = torch.empty(max(1, n_tok) if hold else rows, self.vocab, dtype=self.dtype, device=dev)
        gh = torch.empty_like(x.hidden) if need[0] else None
        acc_w = accumulator(strategy, self.vocab, self.hidden, self.dtype, dev) if need[1] and not hold else None
        acc_b = ones = None
        if need[2]:
            # d bias = column sums of d logits, as a [1, rows] x [rows, V] product into float32: torch's
            # sum(0, dtype=float32) of a tall bf16 matrix staged float32 partials of (rows / 8) x V
            # (0.49 GiB at b8 holding d logits, round21a's token-is-bias record; docs/fused-kernel.md)
            acc_b = torch.zeros(1, self.vocab, dtype=torch.float32, device=dev)
            ones = torch.ones(1, max(1, n_tok) if hold else rows, dtype=self.dtype, device=dev)
        h_all = x.hidden
        if grads_needed and s.has_mask and (need[1] or need[2]):
            # d weight reads hidden: masked rows (whose d logits are 0) must add exactly 0, even when non-finite
            h_all = x.hidden.masked_fill((x.mask == 0).unsqueeze(-1), 0)
        # holding every row's d logits anyway, one chunk: the three GEMMs at full size (float32 logits still
        # need their own buffer, so they stay chunked)
        step = max(1, n_tok) if hold and lbuf is None else rows
        for r0 in range(0, n_tok, step):
            r1 = min(n_tok, r0 + step)
            zbuf = None if lbuf is None else lbuf[: r1 - r0]
            buf = zbuf if dlogits is None else dlogits[r0:r1] if hold else dlogits[: r1 - r0]
            zbuf = buf if zbuf is None else zbuf
            if x.ref_weight is not None:
                self._ref_logp(x, zbuf, r0, r1, ref_lp)
            h = h_all[r0:r1]
            self._logits(zbuf, h, x.weight, x.bias)
            self._loss_rows(zbuf, buf, x, ref_lp, wb, c_used, loss_tok, ws, r0, r1, write_grad=grads_needed)
            if need[0]:
                torch.mm(buf, x.weight, out=gh[r0:r1])
            if acc_w is not None:
                self.accumulate_path = acc_w.add(buf, h, self.settings.accumulate)
            if acc_b is not None and not hold:
                accumulate_fp32(acc_b, ones[:, : r1 - r0], buf, self.settings.accumulate)
        gw = gb = None
        if need[1]:
            gw = torch.mm(dlogits.t(), h_all) if hold else acc_w.finish()
        if need[2]:
            if hold:
                accumulate_fp32(acc_b, ones[:, :n_tok], dlogits[:n_tok], self.settings.accumulate)
            gb = acc_b.view(-1).to(self.dtype)
        return Result(loss_tok[:n_tok].sum(), (gh, gw, gb), c_used)

    def observe(self, dloss: torch.Tensor) -> None:
        """The next call predicts this backward's upstream scalar (kept where it is 0 or not finite). In float16
        at least 1 in magnitude: a smaller fold puts d logits deeper into float16's subnormal range, and the
        rescale to a larger real upstream multiplies that rounding back up (the upstream probe's tiny scalar,
        then 132: d weight elements 16% off; docs/checks.md, "float16 and the other declared dtypes")."""
        d = dloss.detach().to(torch.float32).reshape(1)
        if self.dtype == torch.float16:
            d = torch.where((d.abs() < 1) & (d != 0), torch.where(d < 0, -1.0, 1.0), d)
        self.c_pred.copy_(torch.where(torch.isfinite(d) & (d != 0), d, self.c_pred))

    def rescale(self, grads, c_used: torch.Tensor, dloss: torch.Tensor) -> None:
        """grads *= dloss / c_used, in place, where they differ (decided on the device)."""
        d = dloss.detach().to(torch.float32).reshape(1).contiguous()
        for g in grads:
            if g is None or g.numel() == 0:
                continue
            n = g.numel()
            block = 4096
            programs = triton.cdiv(n, block)
            if g.is_cuda and not interpreting():
                programs = min(programs, 8 * torch.cuda.get_device_properties(g.device).multi_processor_count)
            kernels._rescale_kernel[(programs,)](g, n, c_used, d, BLOCK=block, num_warps=4)
