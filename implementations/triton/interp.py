"""Interpreter-only launches of the member kernels (TRITON_INTERPRET=1, the CPU); never on CUDA.

Why: the interpreter runs a launch's programs one after another, each as Python executing every `tl`
operation through triton.language's front end on numpy arrays: ~50-90 us per operation on this
machine whatever the tensor size at CPU shapes, ~1 ms per launch. The plain kernels (members.py) run
one program per logits row: ~12 ms of CPU per row for a forward and backward (a [4, 12, 1536] call:
0.5-0.7 s). Here one program handles every row as 2-D tiles, so a call costs two launches and a few
hundred operations whatever the row count (docs/timing.md, CPU section, has the measurements).

The twins (interp_rows.py) share the member semantics with the plain kernels
(`_differences`, `_token_terms`, `_policy_terms`, `_kl_terms` of members.py, called on tiles of
tokens as `_terms_kernel` already does), the per-call buffer `ws`, the plan's `flag` and the gradient
modes; what differs is the loop structure. Each is the single-chunk case of its plain twin (the
interpreter's only case: its programs cannot wait for each other):
- `_rows_main_kernel` = `_main_kernel` with NUM_CHUNKS = 1 (IN_BACKWARD included); FUSED also does
  the work of `_norm_kernel` (per-sequence weights) and `_finalize_kernel` (the loss sum, same lanes
  and order) when one program holds every row (`InterpPlan`);
- `_rows_stats_kernel` = `_stats_kernel` with NUM_CHUNKS = 1;
- `_rows_grad_kernel` = `_grad_kernel` with one work item per row;
The kernels that reduce over sequences (sequences.py) need no twin: they run with the whole batch as
one tile here.
The running (max, sum of exp) over a row's blocks is `_block_update` of kernels.py, per row, with the
exponent's base set to 0 where a row has no finite maximum yet (masked rows of the tile, which the
plain kernels never run). Masked rows are never read (every load of a row is masked by its
liveness); a token whose row is not live reads its per-token inputs at token 0 (a valid address) and
every value derived from them is discarded with `tl.where`. Index arithmetic is int64 (the
interpreter checks every int32 add and multiply for overflow: ~7 more operations each). bfloat16
logits and gradients travel as their int16 bits (`_Bits`): widened by a shift, rounded to nearest
even by integer operations, where the interpreter's own conversion cost ~20 ms per [64, 2048] tile
and truncated instead of rounding (54% of a bf16 gradient's elements one step off the correctly
rounded value; 0.003% now, where the float32 gradient itself is one step off).
Tested: tests/test_triton_members.py (every member, every dtype it runs, through autograd against
the float64 reference; its multi-chunk part keeps the plain kernels); the validator on the CPU.

`use_interpreter_shim()` (plan.py calls it when interpreting): Triton's interpreter patches
`triton.language` (`inspect.getmembers` over four modules, ~3 ms) for every launch and again on
every call of a nested `@triton.jit` function (our helpers, and triton.language.standard's
`tl.sum`, `tl.max`, `tl.zeros`, ...), although the launch keeps its patch until it returns. The shim
patches both modules those functions can see (triton.language and triton.language.core) once per
launch, with the module's builtin names listed once, and lets nested calls skip the second patch
(it would set the same attributes again). With a Triton whose interpreter lacks what it relies on,
it does nothing (calls are then slower, not different).
"""

from __future__ import annotations

import inspect
import types

import torch
import triton
import triton.language as tl

from . import fastlaunch
from .interp_rows import _rows_grad_kernel, _rows_main_kernel, _rows_stats_kernel
from .plan import Plan, interpreting
from .sequences import _norm_kernel, _terms_kernel

# Tile budget of one operation (elements): numpy's per-call overhead is amortised above ~2^14
# elements, and the interpreter refuses blocks above 2^20.
TILE = 1 << 17
BLOCK_MAX = 1 << 16


def shape(rows: int, vocab: int) -> dict:
    """ROWS x BLOCK of a row-blocked launch: the whole vocabulary in one block where it fits
    BLOCK_MAX (one step per pass), then as many rows as the tile holds (every row in one program
    at the CPU tier's shapes)."""
    block = min(triton.next_power_of_2(max(1, vocab)), BLOCK_MAX)
    rows_p2 = triton.next_power_of_2(max(1, rows))
    return dict(ROWS=max(1, min(rows_p2, TILE // block)), BLOCK=block)


def main_shape(rows: int, vocab: int) -> dict:
    """`shape`, and ONE_BLOCK where the vocabulary fits one block (the main twin keeps it for the gradient)."""
    s = shape(rows, vocab)
    return dict(s, ONE_BLOCK=vocab <= s["BLOCK"])


class _Bits:
    """A launch whose bfloat16 tensors (at `positions` of its arguments) travel as their int16 views."""

    __slots__ = ("launch", "positions")

    def __init__(self, launch, positions):
        self.launch, self.positions = launch, positions

    def __call__(self, stream, *args):
        args = list(args)
        for i in self.positions:
            args[i] = args[i].view(torch.int16)
        self.launch(stream, *args)


def launches(plan, Launch) -> None:
    """Replace a plan's row-per-program launches (stats, main, grad) with the row-blocked twins, and give
    its kernels that reduce over sequences (terms, norm) the whole batch as one tile."""
    s = plan.sem
    sw = dict(plan.switches)
    bf16 = plan.dtype == torch.bfloat16
    main = dict(shape(plan.rows, plan.vocab), BF16=bf16)
    stats = dict(shape(plan.tokens, plan.vocab), BF16=bf16)

    def bits(launch, *positions):
        return _Bits(launch, positions) if bf16 else launch

    plan.l_stats = bits(Launch(_rows_stats_kernel, (triton.cdiv(max(1, plan.tokens), stats["ROWS"]),),
                               dict(**stats, HAS_MASK=s.has_mask, HAS_OLD=s.has_old, HAS_KL=s.has_kl), {}, False), 0)
    main_grid = (triton.cdiv(plan.rows, main["ROWS"]),)
    plan.l_main = [bits(Launch(_rows_main_kernel, main_grid, dict(N_ROWS=plan.rows, **main, **sw, PER_SEQ_W=s.norm != 0,
                                                                  IN_BACKWARD=bwd, ONE_BLOCK=plan.vocab <= main["BLOCK"]),
                               {}, False),
                        0, 9) for bwd in (False, True)]
    plan.l_grad = [bits(Launch(_rows_grad_kernel, main_grid, dict(N_ROWS=plan.rows, **main, FORCE_STATS=f or s.coupled,
                                                                  UPDATE_FLAG=not s.coupled), {}, False), 0, 2)
                   for f in (False, True)]
    batch_p2 = triton.next_power_of_2(plan.batch)
    if batch_p2 * plan.block_t <= TILE:  # every sequence in one tile (else the GPU's tile height)
        tile = dict(BLOCK_T=plan.block_t, BLOCK_B=batch_p2)
        plan.l_terms = [Launch(_terms_kernel, (1,), dict(**sw, NEEDS_LOGP=s.needs_logp, NORM=s.norm,
                                                         SEQUENCE=s.sequence, VESPO=s.vespo, WRITE_COEF=w, **tile),
                               {}, False)
                        for w in (False, True)]
        plan.l_norm = Launch(_norm_kernel, (1,), dict(GLOBAL=s.norm == 2, WRITE_W=s.norm != 0, SEQ_RHO=s.seq_rho,
                                                      HAS_MASK=s.has_mask, **tile), {}, False)


class InterpPlan(Plan):
    """The plan of an interpreted call (impl.py picks it when interpreting with `interp_rows`): as
    Plan, and the forward of a token-level member in one launch where one program holds every row
    (`_rows_main_kernel` FUSED: no _norm_kernel or _finalize_kernel launch, ~25% of such a call's
    interpreted operations at the CPU tier's shapes). Members with per-sequence sampling ratios (their
    norm launch computes them), coupled and deferred members keep Plan's forward."""

    def _launches(self) -> None:
        super()._launches()
        self.l_fused = None
        s = self.sem
        if not (self.tuning.interp_rows and interpreting()) or self.deferred or s.coupled or s.seq_rho:
            return
        main = main_shape(self.rows, self.vocab)
        seq_p2 = triton.next_power_of_2(max(1, self.seq))
        tok_p2 = triton.next_power_of_2(max(1, self.tokens))
        if main["ROWS"] < self.rows or main["ROWS"] * seq_p2 > TILE or tok_p2 > TILE:
            return
        bf16 = self.dtype == torch.bfloat16
        launch = fastlaunch.Launch(_rows_main_kernel, (1,), dict(
            N_ROWS=self.rows, **main, BF16=bf16, **self.switches, PER_SEQ_W=s.norm != 0, IN_BACKWARD=False,
            FUSED=True, GLOBAL_W=s.norm == 2, BATCH=self.batch, SEQ_P2=seq_p2, TOK_P2=tok_p2,
            FIN_BLOCK=1024), {}, False)
        self.l_fused = _Bits(launch, (0, 9)) if bf16 else launch

    def forward_full(self, x):
        if self.l_fused is None:
            return super().forward_full(x)
        logits, ids, adv, old, ref, mask, rho = x
        loss = torch.empty((), dtype=torch.float32, device=self.device)
        grad = torch.empty(self.grad_shape, dtype=self.dtype, device=self.device)
        ws = self._ws()
        self.l_fused(self.stream, logits, ids, adv, old, ref, mask, rho, adv, adv, grad, self.partials, loss, ws,
                     self.flag, self.tokens, self.stride_b, self.stride_t, self.seq, self.vocab, *self.term_args)
        return loss, grad, ws


def use_interpreter_shim() -> bool:
    """Patch `triton.language` once per launch instead of once per nested call (module docstring).
    Idempotent; returns whether the shim is on."""
    try:
        from triton.runtime import interpreter as itp
    except ImportError:
        return False
    executor = getattr(itp, "GridExecutor", None)
    needed = ("_patch_lang", "_patch_builtin", "_patch_attr", "_LangPatchScope")
    if executor is None or not all(hasattr(itp, n) for n in needed) or not hasattr(tl.core, "is_builtin"):
        return False
    if getattr(executor.__call__, "grpo_shim", False):
        return True
    original_patch, original_call, held = itp._patch_lang, executor.__call__, [False]
    # A function that sees both modules the interpreter patches (tl and tl.core): one patch covers
    # every nested helper, ours and triton.language.standard's (tl.sum, tl.max, tl.zeros, ...).
    both = types.FunctionType((lambda: None).__code__, {"tl": tl, "core": tl.core})
    builtins: dict = {}

    def _patch_builtin(pkg, builder, scope):
        """The interpreter's own, with the module's builtin names listed once (inspect.getmembers on
        every patch was most of its cost)."""
        names = builtins.get(id(pkg))
        if names is None:
            names = builtins[id(pkg)] = [n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name in names:
            member = getattr(pkg, name, None)
            if tl.core.is_builtin(member):
                itp._patch_attr(pkg, name, member, builder, scope)

    def _patch_lang(fn):
        if held[0]:  # inside a launch that patched tl and tl.core: a second patch changes nothing
            return itp._LangPatchScope()
        return original_patch(fn)

    def __call__(self, *args, **kwargs):
        if held[0]:
            return original_call(self, *args, **kwargs)
        scope = original_patch(both)
        held[0] = True
        try:
            return original_call(self, *args, **kwargs)
        finally:
            held[0] = False
            scope.restore()

    __call__.grpo_shim = True
    itp._patch_builtin, itp._patch_lang, executor.__call__ = _patch_builtin, _patch_lang, __call__
    return True
