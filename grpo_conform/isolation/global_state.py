"""Process-global state a call must leave as it found it (the `no-global-side-effects` check).

A loss kernel runs inside a training step: a default dtype left at float64, grad mode switched on
inside the caller's `torch.no_grad`, TF32 or determinism flags flipped, the thread count changed, or
the global random generator reseeded (every step's dropout masks replayed) all break the caller while
the loss and gradient stay right. The adversarial round of 2026-12-05 had each accepted; nothing
compared process state around a call.

The worker snapshots the settings below right before the implementation's forward or backward and
right after (`Watch.around`), records what changed, and puts the old value back, so the validator's
own work and the next call start from the same state. Before every call each random generator is
advanced by a drawn count, as a caller's step would between two loss calls (never reseeded: that
would show in `initial_seed()`): a call that draws numbers of its own is left alone, one that
reseeds changes `initial_seed()` or leaves the same state after two calls, which is recorded. The implementation runs in this process and could
restore what it changed before returning, or forge this module: a tripwire for honest mistakes,
like `tamper-scan`, not a proof.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

MAX_EFFECTS = 16  # what one workload reports at most (the reply model's bound)


def _settings(torch: Any) -> list[tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    """(name, read, restore) of every process-wide setting judged."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn

    def flag(obj: Any, attr: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        return (lambda: getattr(obj, attr)), (lambda v: setattr(obj, attr, v))

    out = [
        ("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype),
        ("torch.is_grad_enabled()", torch.is_grad_enabled, torch.set_grad_enabled),
        ("torch.is_anomaly_enabled()", torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        ("torch.are_deterministic_algorithms_enabled()", torch.are_deterministic_algorithms_enabled,
         torch.use_deterministic_algorithms),
        ("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision,
         torch.set_float32_matmul_precision),
        ("torch.get_num_threads()", torch.get_num_threads, torch.set_num_threads),
        ("torch.backends.cuda.matmul.allow_tf32", *flag(cuda, "allow_tf32")),
        ("torch.backends.cudnn.allow_tf32", *flag(cudnn, "allow_tf32")),
        ("torch.backends.cudnn.benchmark", *flag(cudnn, "benchmark")),
        ("torch.backends.cudnn.deterministic", *flag(cudnn, "deterministic")),
    ]
    if hasattr(torch, "get_default_device"):
        out.append(("torch.get_default_device()", torch.get_default_device, torch.set_default_device))
    return out


def _generators(torch: Any, advanced: set[str]) -> dict[str, str]:
    """A digest of each random generator's state a caller's training step draws from, for the generators
    `_advance` could move (one it could not would repeat its state after every call: never a finding)."""
    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()[:16]

    out = {"torch CPU generator": digest(torch.get_rng_state().numpy().tobytes()),
           "Python's random": digest(repr(random.getstate()).encode())}
    if "torch CUDA generator" in advanced:
        out["torch CUDA generator"] = digest(b"".join(s.cpu().numpy().tobytes() for s in torch.cuda.get_rng_state_all()))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # ('MT19937', key array, pos, has_gauss, cached_gaussian): the key's bytes, not its repr (numpy's
        # array printing took ~1.5 ms a call, twice per forward and backward: the worker's largest cost on the CPU)
        kind, key, *rest = numpy.random.get_state()
        out["NumPy's global generator"] = digest(key.tobytes() + repr((kind, *rest)).encode())
    return out


def _advance(torch: Any, sink: Any, k: int) -> set[str]:
    """Draw k numbers from every generator, as a caller's training step does between two loss calls: no
    reseeding (that would show in `initial_seed()`) and no new tensor storage (after the allocator's poison).
    Returns the generators whose state `_generators` may compare (CUDA's only where its offset can move)."""
    sink[:k].uniform_()
    for _ in range(k):
        random.random()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.random(k)
    moved = set()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            for gen in torch.cuda.default_generators:
                gen.set_offset(gen.get_offset() + 4 * k)
            moved.add("torch CUDA generator")
        except (AttributeError, RuntimeError):  # a torch without offsets: CUDA's generator is not judged
            pass
    return moved


def _seeds(torch: Any) -> dict[str, int]:
    out = {"torch.initial_seed()": torch.initial_seed()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch.cuda.initial_seed()"] = torch.cuda.initial_seed()
    return out


@contextmanager
def deterministic_algorithms(on: bool) -> Iterator[None]:
    """The validator's own switch for a call made as under transformers' `full_determinism`:
    torch.use_deterministic_algorithms(True, warn_only=True) (warn_only: an op without a deterministic
    implementation warns instead of failing an honest kernel), the previous setting put back after. The worker
    sets it outside `Watch.around`, so the tripwire compares what the call found with what it left.
    torch.use_deterministic_algorithms also sets torch._inductor.config.deterministic, importing it (dynamo and
    Triton: ~0.5 s in every worker, +10% on the CPU tier's check): here torch's own flag, and inductor's only
    where an implementation has loaded it (torch.compile's users)."""
    if not on:
        yield
        return
    import torch  # lazily, as the worker's ops

    inductor = sys.modules.get("torch._inductor.config")
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              getattr(inductor, "deterministic", None))
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    if inductor is not None:
        inductor.deterministic = True
    try:
        yield
    finally:
        torch._C._set_deterministic_algorithms(before[0], warn_only=before[1])
        if inductor is not None:
            inductor.deterministic = before[2]


@dataclass
class Watch:
    """What the implementation's calls changed, for one worker (reported and cleared per workload)."""

    effects: list[dict[str, str]] = field(default_factory=list)
    _after: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)  # (generator, state) -> first call
    _sink: Any = None
    _calls: int = 0

    def around(self, call: str, phase: str, fn: Callable[[], Any]) -> Any:
        import torch  # lazily, as the worker's ops

        settings = _settings(torch)
        before = {name: read() for name, read, _ in settings}
        if self._sink is None:
            self._sink = torch.empty(64)
        advanced = _advance(torch, self._sink, 1 + os.urandom(1)[0] % 64)  # drawn: a fixed count would be a tell
        seeds = _seeds(torch)
        where = f"{call} ({phase})"
        self._calls += 1
        try:
            return fn()
        finally:
            for name, read, restore in settings:
                now = read()
                if now != before[name]:
                    self._note(where, name, before[name], now)
                    try:
                        restore(before[name])
                    except Exception:  # noqa: BLE001 - a setting torch refuses back is reported all the same
                        pass
            for name, seed in _seeds(torch).items():
                if seeds.get(name, seed) != seed:
                    self._note(where, name, seeds[name], f"{seed} (reseeded)")
            for name, state in _generators(torch, advanced).items():
                first = self._after.setdefault((name, state), (self._calls, where))
                if first[0] != self._calls:  # every call begins from a state advanced by a drawn count: a reseed repeats
                    self._note(where, name, f"the state after {first[1]}",
                               "the same state again, though the call began from another: reseeded")

    def _note(self, where: str, name: str, before: Any, after: Any) -> None:
        if len(self.effects) < MAX_EFFECTS and not any(e["state"] == name for e in self.effects):
            self.effects.append({"call": where[:300], "state": name[:300], "before": str(before)[:300],
                                 "after": str(after)[:300]})

    def report(self) -> list[dict[str, str]]:
        out, self.effects = self.effects, []
        return out
