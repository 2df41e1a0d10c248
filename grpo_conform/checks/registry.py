"""Every check the validator makes, by name. The names are a contract: the JSON report, the
evidence records and the example gallery (tests/gallery) use them.

`catches` refers to the rows of the catalogue of ways kernels fool evaluators
(docs/checks.md, from ../shared/design/checks.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckInfo:
    name: str
    summary: str
    catches: tuple[int, ...]
    cuda_only: bool = False
    informational: bool = False
    static: bool = False  # judged from the folder's files in the parent, once per implementation


_CHECKS = (
    CheckInfo("runs", "every call returns within the timeout, without an exception, a crash or a CUDA error", (22,)),
    CheckInfo("contract", "the loss is a plain torch.Tensor holding one float32/float64 value that autograd can "
              "differentiate; the gradient has the logits' shape, dtype and device", (16,)),
    CheckInfo("loss", "the loss matches the float64 reference (necessary, never sufficient: it is -mean(A))", (1,)),
    CheckInfo("gradient", "every gradient element matches the float64 reference within a per-row relative "
              "tolerance, and so does the Frobenius norm; several seeds and row profiles", (2, 3, 5, 21)),
    CheckInfo("gradient-row-sums", "each gradient row sums to ~0 over the vocabulary", (2,)),
    CheckInfo("last-row-zero", "the gradient of the extra last position is exactly 0", (6,)),
    CheckInfo("finite", "no NaN or Inf in any output of any call", (12,)),
    CheckInfo("no-mutation", "every input is bitwise unchanged after forward and after backward", (8,)),
    CheckInfo("no-aliasing", "the storage of the loss and the gradient overlaps no input's storage", (9,)),
    CheckInfo("no-output-reuse", "the outputs of a call are unchanged after later calls", (10,)),
    CheckInfo("freshness", "results follow new values written in place at the same addresses, and new buffers",
              (13,)),
    CheckInfo("stale-output", "outputs are complete and identical whatever garbage the allocator held "
              "(allocator poisoned with NaN, then with a huge finite pattern)", (11,)),
    CheckInfo("last-row-ignored", "poisoning logits[:, S, :] with NaN or huge values changes no output", (6,)),
    CheckInfo("advantage-sign", "negating the advantages negates the gradient", (7,)),
    CheckInfo("zero-advantage", "a zero advantage gives an exactly zero gradient for its sequence, and a batch "
              "whose every advantage is 0 gives the reference's result (exactly zero without a KL term, the KL "
              "term alone with one), and so does one whose every advantage is one non-zero value", (7,)),
    CheckInfo("row-locality", "changing one logits row changes that gradient row and no other", (7,)),
    CheckInfo("adversarial-inputs", "row profiles mixed in one batch (normal, wide, up to 1e4, near one-hot, "
              "heavy-tailed), also in each declared dtype the default workloads leave out, match the reference "
              "and stay finite", (4,)),
    CheckInfo("upstream-gradient", "backward with parent-drawn upstream scalars (negative, tiny, large, in float16 "
              "a loss scale up to 2^16 where the gradient is formed in backward; through loss.backward and "
              "torch.autograd.grad; also in each declared dtype the default workloads leave out) gives that "
              "multiple of the reference gradient", (2,)),
    CheckInfo("non-leaf-logits", "logits handed over as a view or an affine function of a leaf: the gradient "
              "reaches that leaf through autograd (an implementation writing logits.grad itself fails)", (2, 16)),
    CheckInfo("interleaved-graphs", "several forwards before their backwards (2-3 graphs, backward of their "
              "sum; 3-5 graphs, backwards in a drawn order and grouping; the counts drawn per run): each gradient "
              "matches its own inputs' reference (no state between calls)", (10, 13)),
    CheckInfo("input-layouts", "inputs passed as offset, strided views of larger buffers (slices such as "
              "input_ids[:, P:], padded vocabularies) give the reference result", (16,)),
    CheckInfo("masked-positions", "positions the completion mask excludes get an exactly zero gradient, and "
              "redrawing their logits changes no output", (3, 7)),
    CheckInfo("exact-ties", "every ratio exactly at a clip bound (1 - epsilon_low, 1 + epsilon_high, epsilon = 0, "
              "and every bound a member's cases name: delta, CISPO's cap), also in each declared dtype the default "
              "workloads leave out, gives the spec's gradient: at a tie the unclipped branch is active", (4,)),
    CheckInfo("near-ties", "every ratio (every sequence's, six calls, at sequence level) a hair either side of "
              "the clip bound its advantage decides by (1e-5 to "
              "4e-3, relative, each farther than an honest implementation's log-probs may stray: the fused "
              "operation's logits quieted first), also in each declared dtype the default workloads leave out, "
              "gives the reference's branch (a branch picked from a ratio in a narrower dtype flips)", (4,)),
    CheckInfo("declared-cases", "the parameters at the values the spec declares (every default exactly, both "
              "ends of every range, every pair of parameters at each combination of its ends, the member's named "
              "cases and equalities, and both sides of the band the draws keep around an avoided value: a "
              "temperature near 1, not 1) give the reference result", (2,)),
    CheckInfo("far-ratios", "every ratio far out on its unclipped side (3 to 30 for A < 0, 0.02 to 0.3 for A > 0) "
              "gives the reference result: no clip the member does not declare", (4,)),
    CheckInfo("forward-only", "under torch.no_grad (evaluation, logging), and with grad enabled but no input "
              "requiring grad (a frozen model), the loss matches the reference", (1,)),
    CheckInfo("inference-mode", "under torch.inference_mode the loss matches the reference and every input is "
              "bitwise unchanged after the call", (1, 8)),
    CheckInfo("retained-graph", "a backward with retain_graph=True, then torch.autograd.grad through the same graph "
              "again (other upstream scalars): both gradients match the reference", (2, 10)),
    CheckInfo("grad-accumulation", "every .grad already holds a value when backward runs (a first backward with "
              "retain_graph=True, then loss.backward again), or before the forward (an earlier micro-batch's, then "
              "backward with 1/k): every gradient is accumulated into it at the call's upstream, not written over "
              "it", (2, 10)),
    CheckInfo("tied-weights", "the lm_head weight also used as the input embedding in the same graph: autograd "
              "sums both uses into weight.grad (an implementation setting weight.grad itself loses one)", (2, 16)),
    CheckInfo("frozen-inputs", "grpo-fused-linear: with only some differentiable inputs requiring grad (the lm_head "
              "frozen, or the trunk), the gradients asked for match the reference, with the inputs contiguous and "
              "as offset, strided views", (2,)),
    CheckInfo("rewritten-inputs", "each input the member declares, written over in place between forward and "
              "backward (a caller must not; one call per input): backward gives the forward's inputs' gradient or "
              "raises, never the gradient of the new values", (2,)),
    CheckInfo("repeated-calls", "100 calls at one small shape with fresh inputs each all match the reference (no "
              "switch after some calls, no result cached by shape)", (13,)),
    CheckInfo("reach", "calls past the sizes where kernels switch (batch past 256, rows past 1024 in each of two or "
              "three sequences and past 16384 in all (one sequence for the fused operation on the CPU, two past 2048 "
              "rows for its sequence-level member), vocabulary past "
              "2^17 and, in a call of 4-6 rows, past 2^18 (but the fused operation on the CPU), hidden past 4096 off every block; on CUDA rows past 65535), one axis at a time, in each declared dtype the "
              "default workloads leave out, with a mask drawn per token, an upstream scalar other than 1 and, for "
              "rows and vocabulary, torch.autograd.grad, the vocabulary call's rows each with a planted peak, the peaks "
              "spread over the vocabulary, and one call at aligned sizes (rows 128, vocabulary a multiple of 512 (4096 "
              "for the logits operation), hidden of 64): all match the reference", (2, 21)),
    CheckInfo("no-global-side-effects", "the process's global state is as each call found it: default dtype and "
              "device, grad mode, anomaly and determinism flags, TF32, cuDNN flags, thread count, and random "
              "generators never reseeded (a worker-side tripwire, like tamper-scan)", ()),
    CheckInfo("no-resource-growth", "over the repeated calls the worker keeps no more file descriptors, threads, "
              "live tensors, CUDA memory or frozen objects than after its first ten (nothing kept per call; a "
              "worker-side tripwire)",
              ()),
    CheckInfo("tamper-scan", "the source names none of the validator's internals (grpo_conform, __main__, "
              "sys.modules writes, gc.get_objects, frame walking, ctypes, /proc/, ptrace): a static tripwire, not "
              "a proof", (), static=True),
    CheckInfo("determinism", "reported, never failed (the spec leaves it unspecified): bitwise equal across "
              "identical calls, or the largest difference", (), informational=True),
    CheckInfo("timed-outputs", "a random subset of the outputs of timed calls matches the reference", (13, 14),
              cuda_only=True),
    CheckInfo("timing-floor", "no timing is below the DRAM floor of its protocol (impossible results are "
              "rejected)", (18,), cuda_only=True),
    CheckInfo("side-stream", "CUDA-event time is not far below host wall time around a device-wide "
              "synchronize (work hidden on another stream)", (15,), cuda_only=True),
    CheckInfo("caching", "identical repeated inputs do not run more than 10% faster than fresh ones", (13,),
              cuda_only=True),
)

CHECKS_BY_NAME: dict[str, CheckInfo] = {c.name: c for c in _CHECKS}
CONFORMANCE_CHECKS: tuple[str, ...] = tuple(c.name for c in _CHECKS if not c.cuda_only and not c.static)
TIMING_CHECKS: tuple[str, ...] = tuple(c.name for c in _CHECKS if c.cuda_only)
