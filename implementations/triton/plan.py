"""Per-shape plans: everything a call needs that does not change between calls, built once.

A `Plan` is cached per (shapes, strides, dtypes, device, stream, member semantics, parameter
values): it holds the grids, the constexpr settings, the scalar arguments, the two-float `flag`
(the mode the next forward uses and the d loss the last backward received), the arrival counters
of its multi-chunk kernels, and chooses the staged (Gluon) kernels where they can run. Per call
only the per-call buffers are allocated (gradient, the 7 * tokens + 2 floats of `ws`, the loss)
and the kernels launched: no host synchronisation, nothing proportional to the shape in Python.

Scratch shared by all plans of one (device, stream): the per-chunk partial statistics (kernels of
one stream run in order). Plans are keyed by stream for the same reason (the flag, too, is read
and written in stream order). Counters belong to one plan and one kernel kind (`Counters`).

Where the gradient is written (docs/triton-kernel-notes.md, rounds 8 and 9):
- a member whose loss does not read the logits (token-is: the ratio is exactly 1) is `deferred`:
  the forward computes the loss from the advantages alone, and backward runs the main kernel
  once with d loss read on the device: logits read once, gradient written once, for any d loss;
- other token-level members: the forward's main kernel reads the flag on the device; mode 0
  writes c_pred * gradient in the loss's pass (c_pred: the d loss the last backward received, so
  two DRAM passes whenever d loss repeats: 1, 1/accumulation steps, a loss scale); mode 1 saves
  the statistics and backward writes d loss * gradient in one more pass (three passes for any
  d loss). The mode and c_pred a forward used are stored in its own `ws`, so a backward is
  correct whatever the flag said (a mispredicted call recomputes from the statistics);
- sequence-level members: statistics in forward, gradient in backward, always.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import torch
import triton

from . import configs, fastlaunch, grad, launch, members, sequences

# Elements of one [BLOCK_B, BLOCK_T] tile of the kernels that reduce over sequences (sequences.py), with
# 8 warps: 16 per thread, enough loads in flight to cover the latency (an H100 measured 16.9 -> 6.9 us
# for the masked member's norm kernel at b8 s1024 against one sequence at a time).
NORM_TILE = 4096
NORM_WARPS = 8

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _fp32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


@dataclass(frozen=True)
class Semantics:
    """What a call computes (docs/architecture.md section 2), as kernel switches and scalars."""

    has_old: bool
    has_kl: bool
    has_mask: bool
    has_rho: bool
    has_delta: bool
    has_cap: bool
    cispo: bool
    sapo: bool  # the clip's two scalars (eps_low, eps_high) carry SAPO's gate temperatures (pos, neg)
    vespo: bool  # the sequence's gamma weight couples its tokens: the path of sequence-level ratios
    sequence: bool
    norm: int  # 0: constant weight w_const, 1: per sequence (grpo), 2: over the batch (bnpo, dapo)
    w_const: float
    inv_temp: float  # 1/T rounded to fp32 (what the kernels receive) ...
    inv_lo: float  # ... and the rest of 1/T: the float64 differences use inv_temp + inv_lo
    eps_low: float
    eps_high: float
    delta: float
    beta: float
    cap: float
    kl_bc: bool = False  # TRL 1.16's use_bias_correction_kl: the k3 term times the ratio
    rho_mask: bool = False  # TRL's *_mask vLLM modes: a ratio above the cap is 0 (else truncated)
    seq_rho: bool = False  # TRL's sequence_* vLLM modes: one sampling ratio per sequence (_norm_kernel)
    vespo_args: tuple = (0.0, 0.0, 0.0, 0.0)  # VESPO's k_pos, lambda_pos, k_neg, lambda_neg (lambda >= 1e-4)

    @property
    def needs_logp(self) -> bool:
        """The loss depends on the logits (token-is's ratio is exactly 1: its loss is a function of A)."""
        return self.has_old or self.has_kl or self.cispo or self.vespo

    @property
    def coupled(self) -> bool:
        """A token's coefficient needs its whole sequence (GSPO's ratio, VESPO's weight): statistics in
        forward, gradient in backward."""
        return self.sequence or self.vespo


def semantics_of(batch: int, seq: int, *, has_old: bool, has_ref: bool, has_mask: bool, has_rho: bool,
                 epsilon_low, epsilon_high, temperature, loss_type, importance_sampling_level, beta,
                 max_completion_length, delta, sampling_ratio_cap, num_items_in_batch, num_processes,
                 use_bias_correction_kl=False, vllm_importance_sampling_mode="token_truncate",
                 gradient_accumulation_steps=None, steps_per_generation=None,
                 sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
                 vespo_k_neg=3.0, vespo_lambda_neg=2.0) -> Semantics:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}; got {loss_type!r}")
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence'; got {importance_sampling_level!r}")
    sequence = importance_sampling_level == "sequence"
    if sequence and not has_old:
        raise ValueError("importance_sampling_level='sequence' needs old_logprobs")
    if sequence and loss_type in ("cispo", "sapo", "vespo"):
        raise ValueError(f"loss_type={loss_type!r} is implemented at token level only")
    if loss_type == "sapo" and not (float(sapo_temperature_pos) > 0 and float(sapo_temperature_neg) > 0):
        raise ValueError("sapo_temperature_pos and sapo_temperature_neg must be > 0")
    if loss_type == "vespo" and has_rho:
        raise ValueError("loss_type='vespo' with sampling_ratio is not implemented (TRL folds it into the weight)")
    if loss_type == "vespo" and delta is not None or loss_type == "sapo" and delta is not None:
        raise ValueError(f"delta applies to the clip only, not to loss_type={loss_type!r}")
    beta = float(beta or 0.0)
    if beta != 0.0 and not has_ref:
        raise ValueError("beta != 0 needs ref_logprobs [batch, seq]")
    if float(temperature) <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    mode = vllm_importance_sampling_mode
    if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        raise ValueError(f"vllm_importance_sampling_mode must be token_truncate, token_mask, sequence_truncate or "
                         f"sequence_mask; got {mode!r}")
    seq_rho = has_rho and mode.startswith("sequence")
    if sequence and (seq_rho or (use_bias_correction_kl and beta != 0.0)):
        raise ValueError("importance_sampling_level='sequence' is implemented without the bias-corrected KL and "
                         "with token-level vLLM modes only")
    norm, w_const = 0, 1.0 / (batch * max(1, seq))
    if loss_type == "dr_grpo":
        w_const = 1.0 / (batch * (max(1, seq) if max_completion_length is None else int(max_completion_length)))
    elif loss_type == "luspo":  # every kept token weighs 1 / B (a sequence's sum, then the batch mean)
        w_const = 1.0 / batch
    elif loss_type in ("dapo", "cispo", "vespo") and num_items_in_batch is not None and gradient_accumulation_steps is not None:
        # TRL 1.16 in training: max(1, N) / P * gradient_accumulation_steps / steps_per_generation
        steps = gradient_accumulation_steps if steps_per_generation is None else steps_per_generation
        w_const = 1.0 / (max(1.0, float(num_items_in_batch)) / float(num_processes or 1)
                         * float(gradient_accumulation_steps) / float(steps))
    elif loss_type in ("dapo", "cispo", "vespo") and num_items_in_batch is not None:
        w_const = 1.0 / max(1.0, float(num_items_in_batch) / float(num_processes or 1))
    elif has_mask:
        norm = 1 if loss_type in ("grpo", "sapo") else 2
    sapo = loss_type == "sapo"
    if sapo:  # the gate temperatures travel in the clip's scalars (the clip has no role in SAPO)
        epsilon_low, epsilon_high = sapo_temperature_pos, sapo_temperature_neg
    return Semantics(
        has_old=has_old, has_kl=beta != 0.0, has_mask=has_mask, has_rho=has_rho, has_delta=delta is not None,
        has_cap=has_rho and sampling_ratio_cap is not None, cispo=loss_type == "cispo", sapo=sapo,
        vespo=loss_type == "vespo", sequence=sequence,
        norm=norm, w_const=w_const, inv_temp=_fp32(1.0 / float(temperature)),
        inv_lo=1.0 / float(temperature) - _fp32(1.0 / float(temperature)), eps_low=float(epsilon_low),
        eps_high=float(epsilon_high), delta=float(delta) if delta is not None else 0.0, beta=beta,
        cap=float(sampling_ratio_cap) if sampling_ratio_cap is not None else 0.0,
        kl_bc=bool(use_bias_correction_kl) and beta != 0.0, rho_mask=has_rho and mode.endswith("mask"),
        seq_rho=seq_rho,
        vespo_args=(float(vespo_k_pos), max(float(vespo_lambda_pos), 1e-4), float(vespo_k_neg),
                    max(float(vespo_lambda_neg), 1e-4)))


def kernel_switches(s: Semantics) -> dict:
    """The member switches the main kernels (plain and staged) are specialised on; also what
    tests/test_triton_members.py compiles the staged kernels for."""
    return dict(HAS_OLD=s.has_old, HAS_KL=s.has_kl, HAS_MASK=s.has_mask, HAS_RHO=s.has_rho, HAS_DELTA=s.has_delta,
                HAS_CAP=s.has_cap, CISPO=s.cispo, KL_BC=s.kl_bc, RHO_MASK=s.rho_mask, SEQ_RHO=s.seq_rho, SAPO=s.sapo)


@dataclass(frozen=True)
class Tuning:
    """Launch settings of the plain kernels (the staged ones: launch.GPU_DEFAULT)."""

    main_chunk: int = 16384  # elements per program of the main (waiting) kernel
    main_block: int = 2048
    main_warps: int = 4
    stats_programs: int = 16384  # split rows into chunks until about this many programs
    stats_block: int = 2048
    stats_warps: int = 1
    # backward (_grad_kernel): elements per work item, warps, persistent programs per SM (0: one program
    # per work item). Round 9 (H200, token-offpolicy-mask b8): one program per item costs 0.16 ms when the
    # backward has nothing to do (d loss predicted: 262k programs that exit) and 1.28 ms with work;
    # 2048 / 4 / 32 costs ~0 and 1.34 ms. The predicted path is the common one: persistent.
    grad_chunk: int = 2048
    grad_warps: int = 4
    grad_programs_per_sm: int = 32
    staged: bool = True  # use staged.py where it can run
    head: bool = True  # rows off 16-byte boundaries: the head/body/tail split (staged_rows.py, grad.py)
    interp_rows: bool = False  # interpreter only: the row-blocked twins of interp.py (ROWS rows per program)


GPU_TUNING = Tuning()


def cpu_tuning(vocab: int) -> Tuning:
    """Programs run one after another under the interpreter: a row must be one chunk (nothing to wait for).
    Interpreting, the row-blocked twins (interp.py) replace the row-per-program kernels (interp_rows)."""
    whole = triton.next_power_of_2(vocab)
    return Tuning(main_chunk=whole, main_block=min(whole, 4096), stats_programs=0, stats_block=min(whole, 4096),
                  stats_warps=4, grad_chunk=min(whole, 4096), grad_programs_per_sm=0, staged=False,
                  interp_rows=True)


_SCRATCH: dict = {}


def scratch(device: torch.device, stream: int, partials: int) -> torch.Tensor:
    """Per-chunk partial statistics (float32) of at least this size, shared in stream order."""
    key = (device, stream)
    have = _SCRATCH.get(key)
    if have is None or have.numel() < partials:
        have = _SCRATCH[key] = torch.empty(max(partials, have.numel() if have is not None else 0, 1),
                                           dtype=torch.float32, device=device)
    return have


class Counters:
    """Arrival counters of one kernel kind of one plan. The kernels never reset them: each launch
    adds exactly `chunks` to every live token's counter (members.py), so they are zeroed here, in
    stream order, before an int32 could wrap (after ~2^31 / chunks launches)."""

    __slots__ = ("tensor", "left", "budget")

    def __init__(self, tokens: int, chunks: int, device):
        self.tensor = torch.zeros(max(1, tokens), dtype=torch.int32, device=device)
        self.budget = self.left = (2**31 - 1) // max(1, chunks) - 2

    def __call__(self) -> torch.Tensor:
        self.left -= 1
        if self.left < 0:
            self.tensor.zero_()
            self.left = self.budget - 1
        return self.tensor


class Plan:
    """Launch recipe of one shape and member; see the module docstring."""

    def __init__(self, logits: torch.Tensor, sem: Semantics, tuning: Tuning, stream: int):
        batch, seq_next, vocab = logits.shape
        self.sem, self.tuning = sem, tuning
        self.batch, self.seq, self.vocab = batch, seq_next - 1, vocab
        self.tokens = batch * self.seq
        self.rows = batch * seq_next
        self.device = logits.device
        self.dtype = logits.dtype
        self.grad_shape = (batch, seq_next, vocab)
        # [mode of the next forward, d loss of the last backward]; first guess: mode 0, d loss = 1
        self.flag = torch.tensor([0.0, 1.0], dtype=torch.float32, device=self.device)
        # The loss does not read the logits: everything logits-related happens in backward.
        self.deferred = not sem.needs_logp and not sem.coupled
        self.stride_b, self.stride_t = logits.stride(0), logits.stride(1)
        s = sem
        self.term_args = (s.inv_temp, s.inv_lo, s.eps_low, s.eps_high, s.delta, s.beta, s.cap, s.w_const)
        self.vespo_args = s.vespo_args
        self.switches = kernel_switches(s)
        self.block_t = min(1024, triton.next_power_of_2(max(1, self.seq)))
        self.norm_block_b = min(triton.next_power_of_2(batch), max(1, NORM_TILE // self.block_t))
        cuda = logits.is_cuda and not interpreting()
        self.staged = None
        self.staged_head = False  # rows off 16-byte boundaries: the staged kernels' HEAD path (staged_rows.py)
        if cuda:  # this shape's launch configuration (configs.py: the shipped one unless a measured rule says otherwise)
            self.choice = configs.choose(vocab, self.rows, logits.dtype, "sequence" if sem.coupled else "token")
            self.tuning = tuning = self.choice.tuning_for(tuning, vocab)
        # Rows off 16-byte boundaries (launch.row_layout "head"): the backward's plain kernel splits them on any
        # device (the interpreter runs that path too); the staged kernels where they can run (CUDA, sm_80+).
        layout = launch.row_layout(logits.data_ptr(), logits.element_size(), vocab, seq_next, self.stride_b,
                                   self.stride_t)
        self.grad_head = layout == "head" and tuning.head
        if cuda and tuning.staged:
            rows = launch.staged_rows(logits, launch.Problem.of(logits, 0.2, 0.2, 1.0))
            if rows == "aligned" or (rows == "head" and tuning.head):
                self.staged = self.choice.settings(vocab, logits.dtype)
                self.staged_head = rows == "head"
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count if cuda else 1
        # main (waiting split) kernel
        t = tuning
        self.main_n = triton.cdiv(vocab, t.main_chunk)
        self.main_cfg = dict(CHUNK=t.main_chunk, BLOCK=min(t.main_block, t.main_chunk), NUM_CHUNKS=self.main_n,
                             CHUNKS_P2=triton.next_power_of_2(self.main_n), HINTS=cuda, num_warps=t.main_warps)
        # stats (last arriver) kernel
        if t.stats_programs:
            splits = max(1, min(64, t.stats_programs // max(1, self.tokens)))
            chunk = triton.cdiv(triton.cdiv(vocab, splits), t.stats_block) * t.stats_block
        else:
            chunk = triton.next_power_of_2(vocab)
        self.stats_n = triton.cdiv(vocab, chunk)
        self.stats_cfg = dict(CHUNK=chunk, BLOCK=min(t.stats_block, chunk), NUM_CHUNKS=self.stats_n,
                              CHUNKS_P2=triton.next_power_of_2(self.stats_n), num_warps=t.stats_warps)
        # backward
        self.grad_n = triton.cdiv(vocab, t.grad_chunk)
        self.grad_items = self.rows * self.grad_n
        programs = self.grad_items if not t.grad_programs_per_sm else min(self.grad_items, t.grad_programs_per_sm * sms)
        self.grad_grid = (max(1, min(programs, 8) if not cuda else programs),)
        self.grad_cfg = dict(CHUNK=t.grad_chunk, NUM_CHUNKS=self.grad_n, HINTS=cuda, HEAD=self.grad_head,
                             VEC=16 // logits.element_size(), num_warps=t.grad_warps)
        self.chunks = {"main": self.main_n, "stats": self.stats_n}
        if self.staged is not None:
            prob, g = launch.Problem.of(logits, 0.2, 0.2, 1.0), self.staged
            for kind, stage, block, warps in (("staged-main", g.stage_bytes, g.block, g.num_warps),
                                              ("staged-stats", g.forward_stage_bytes, g.forward_block,
                                               g.forward_stage_warps)):
                self.chunks[kind] = launch._staged_shape(logits, prob, stage, block, warps)["NUM_CHUNKS"]
        self.partials = scratch(self.device, stream, 2 * self.tokens * max(self.chunks.values()))
        self._counters: dict = {}
        self.stream = stream
        self.fast = fastlaunch.enabled(self.device)
        self._launches()

    def counters(self, kind: str) -> torch.Tensor:
        """The counters of one kernel kind ("main", "stats", "staged-main", "staged-stats"): kinds
        differ in chunks per row, and counters only stay consistent under one chunk count."""
        c = self._counters.get(kind)
        if c is None:
            c = self._counters[kind] = Counters(self.tokens, self.chunks[kind], self.device)
        return c()

    # -- launches (built once; each compiles on its first call) ----------------------------------------
    def _launches(self) -> None:
        L, sw, s = fastlaunch.Launch, self.switches, self.sem

        def cfg(c, **extra):
            c = dict(c)
            return {**extra, **{k: v for k, v in c.items() if k != "num_warps"}}, {"num_warps": c["num_warps"]}

        c, o = cfg(self.stats_cfg, HAS_MASK=s.has_mask, HAS_OLD=s.has_old, HAS_KL=s.has_kl)
        self.l_stats = L(members._stats_kernel, (self.tokens * self.stats_n,), c, o, self.fast)
        seq_tile = dict(BLOCK_T=self.block_t, BLOCK_B=self.norm_block_b)
        self.l_terms = [L(sequences._terms_kernel, (1,), dict(**sw, NEEDS_LOGP=s.needs_logp, NORM=s.norm,
                                                              SEQUENCE=s.sequence, VESPO=s.vespo, WRITE_COEF=w,
                                                              **seq_tile),
                          {"num_warps": NORM_WARPS}, self.fast) for w in (False, True)]
        self.l_norm = L(sequences._norm_kernel, (1,), dict(GLOBAL=s.norm == 2, WRITE_W=s.norm != 0,
                                                           SEQ_RHO=s.seq_rho, HAS_MASK=s.has_mask, **seq_tile),
                        {"num_warps": NORM_WARPS}, self.fast)
        self.l_main = [L(members._main_kernel, (self.rows * self.main_n,),
                         *cfg(self.main_cfg, **sw, PER_SEQ_W=s.norm != 0, IN_BACKWARD=bwd), self.fast)
                       for bwd in (False, True)]
        self.l_finalize = L(members._finalize_kernel, (1,), dict(BLOCK=1024), {"num_warps": 4}, self.fast)
        self.l_grad = [L(grad._grad_kernel, self.grad_grid, {**cfg(self.grad_cfg)[0], "FORCE_STATS": f or s.coupled,
                                                                 "UPDATE_FLAG": not s.coupled},
                         {"num_warps": self.grad_cfg["num_warps"]}, self.fast) for f in (False, True)]
        self.l_staged = {}  # staged_members fills it
        if interpreting():  # interpreter only (CPU): never on a compiled path
            from . import interp
            interp.use_interpreter_shim()
            if self.tuning.interp_rows:
                interp.launches(self, L)

    # -- forward -----------------------------------------------------------------------------------------
    def _ws(self) -> torch.Tensor:
        return torch.empty(7 * self.tokens + 2, dtype=torch.float32, device=self.device)

    def _stats(self, x, ws) -> None:
        logits, ids, _adv, old, ref, mask, _rho = x
        if self.staged is not None:
            from . import staged_members
            if staged_members.stats(self, x, ws):
                return
        self.l_stats(self.stream, logits, ids, mask, old, ref, self.partials, self.counters("stats"), ws, self.tokens,
                     self.stride_b, self.stride_t, self.seq, self.vocab, self.sem.inv_temp, self.sem.inv_lo)

    def _per_sequence(self, x):
        """(wb, rb): the per-sequence weights and sampling ratios where the member has them (_norm_kernel),
        else the advantages stand in (never read)."""
        _logits, _ids, adv, _old, _ref, mask, rho = x
        if not (self.sem.norm or self.sem.seq_rho):
            return adv, adv
        wb = torch.empty(self.batch, dtype=torch.float32, device=self.device) if self.sem.norm else adv
        rb = torch.empty(self.batch, dtype=torch.float32, device=self.device) if self.sem.seq_rho else adv
        self.l_norm(self.stream, mask, rho, wb, rb, self.batch, self.seq)
        return wb, rb

    def _terms(self, x, ws, loss, write_coef: bool) -> None:
        _logits, _ids, adv, old, ref, mask, rho = x
        rb = self._per_sequence(x)[1] if self.sem.seq_rho else adv
        self.l_terms[write_coef](self.stream, ws, adv, old, ref, mask, rho, rb, loss, self.batch, self.seq,
                                 self.tokens, *self.term_args, *self.vespo_args)

    def forward(self, x) -> torch.Tensor:
        """The loss only: the logits are read once, and only where the loss depends on them."""
        loss = torch.empty((), dtype=torch.float32, device=self.device)
        ws = self._ws()
        if self.sem.needs_logp and self.tokens:
            self._stats(x, ws)
        self._terms(x, ws, loss, write_coef=False)
        return loss

    def forward_full(self, x):
        """(loss, gradient buffer or None, ws). Deferred plans: the loss alone, no buffer (backward
        allocates and writes it). Others: the gradient is in the buffer when this call's mode was 0
        (ws[7T] = 0), else backward writes it."""
        if self.deferred:
            return self.forward(x), None, None
        loss = torch.empty((), dtype=torch.float32, device=self.device)
        grad = torch.empty(self.grad_shape, dtype=self.dtype, device=self.device)
        ws = self._ws()
        if self.sem.coupled:  # the coefficient couples a whole sequence: gradient always in backward
            if self.tokens:
                self._stats(x, ws)
            self._terms(x, ws, loss, write_coef=True)
            return loss, grad, ws
        self._main(x, grad, ws, self.flag, in_backward=False)
        self.l_finalize(self.stream, ws, loss, self.tokens)
        return loss, grad, ws

    def _main(self, x, grad, ws, flag, in_backward: bool) -> None:
        """The main kernel, staged where it can run. In backward `flag` is d loss (and ws unused)."""
        logits, ids, adv, old, ref, mask, rho = x
        wb, rb = self._per_sequence(x)
        if ws is None:
            ws = flag  # never read or written under IN_BACKWARD: any tensor stands in
        if self.staged is not None:
            from . import staged_members
            if staged_members.main(self, x, wb, rb, grad, ws, flag, in_backward):
                return
        self.l_main[in_backward](
            self.stream, logits, ids, adv, old, ref, mask, rho, wb, rb, grad, self.partials, self.counters("main"), ws,
            flag, self.tokens, self.stride_b, self.stride_t, self.seq, self.vocab, *self.term_args)

    # -- backward ----------------------------------------------------------------------------------------
    def backward(self, x, grad, ws, dloss, force_stats: bool) -> torch.Tensor:
        """dloss * gradient into `grad`: deferred plans run the main kernel with d loss; others take
        the mode from ws, or recompute from the statistics when forced."""
        logits, ids = x[0], x[1]
        dloss = dloss.to(torch.float32)
        if dloss.data_ptr() % 16:  # the compiled launch assumes the alignment of a fresh tensor
            dloss = dloss.clone()
        if self.deferred:
            self._main(x, grad, None, dloss, in_backward=True)
            return grad
        self.l_grad[force_stats](
            self.stream, logits, ids, grad, ws, self.flag, dloss, self.tokens, self.grad_items,
            self.stride_b, self.stride_t, self.seq, self.vocab, self.sem.inv_temp)
        return grad
