"""The worker: a separate process that loads one implementation, calls it, and hands outputs back.

It holds no reference, no seeds and no keys; it makes no verdict. It only:
- maps the input buffers the parent shared (so the parent sees any write to them),
- poisons its allocator right before a call (stale or partial outputs then show),
- makes every input the parent names in a call (the spec's `gradients`) a leaf that requires grad,
  calls `entry(**inputs, **parameters)`, then backpropagates an upstream scalar,
- reports metadata (types, dtypes, shapes, storage ranges) as JSON and copies the loss and one
  gradient per differentiable input (`{name: grad}`) into output buffers the parent shared,
- keeps earlier outputs alive until dropped, so the parent can see whether a later call changed them.

Everything it says can in principle be forged by the code it runs; the parent therefore decides
from data it reads itself wherever it can (inputs, output values) and treats the reports as
diagnostics. Protocol: length-prefixed JSON messages over a socket passed as a file descriptor;
the operations are those in `OPS` (docs/architecture.md, "Worker protocol", tested against it); any
other op is refused with an error reply: the process that runs untrusted code offers nothing more.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from grpo_conform.isolation import compile_only, triton_keys
from grpo_conform.isolation.global_state import Watch, deterministic_algorithms
from grpo_conform.isolation.resources import sample
from grpo_conform.isolation.loading import harden_worker, import_entry

POISON_BYTES = {"nan": 0xFF, "huge": 0x7B}  # 0xFF..: NaN in every float dtype; 0x7B..: huge finite
PRE_SPIN_CYCLES = 400_000  # ~0.2 ms at 2 GHz: the least GPU work put before a timed call's start event
SPIN_CYCLES_PER_NS = 3  # 1.5 x the host time to enqueue a call, at up to 2 cycles per ns
MAX_SPIN_CYCLES = 40_000_000  # ~20 ms: an implementation that blocks the host gets no longer spin than this


def spin_cycles_for(enqueue_ns: int) -> int:
    """GPU spin before a timed call's start event: at least PRE_SPIN_CYCLES, 1.5x the host time one
    call took to enqueue (at up to 2 cycles per ns), at most MAX_SPIN_CYCLES."""
    return int(min(MAX_SPIN_CYCLES, max(PRE_SPIN_CYCLES, enqueue_ns * SPIN_CYCLES_PER_NS)))


PROFILE_ENV = "GRPO_CONFORM_WORKER_PROFILE"
GRAD_PREFIX = "grad:"  # an output slot's buffer for the gradient of input `name` is "grad:<name>"


class TimedSteps:
    """One timed call's steps for a protocol: `prepare` (untimed), `timed` (between the events), then
    `loss` and `gradients()` (what is copied out for the re-checks). `run` calls the entry.

    - forward: the call under torch.no_grad; full: forward and loss.backward(); full-scaled: forward
      and loss.backward(c);
    - backward: the seed benchmark's backward-only mode (Liger's benchmark scripts: one untimed
      forward, then `triton.testing.do_bench(lambda: y.backward(retain_graph=True),
      grad_to_none=[_input])`). Prepared: the forward and one backward with retain_graph=True (what
      do_bench's warm-up calls leave: every gradient buffer but the first input's holds a gradient),
      then the first differentiable input's .grad set to None (grad_to_none); timed:
      loss.backward(retain_graph=True), which accumulates into the other inputs' .grad as the
      benchmark's repetitions do. For the re-checks the gradients are read as what the timed backward
      added (the .grad after it minus a copy taken before it, outside the clock)."""

    def __init__(self, protocol: str, run, leaves: dict, upstream: float, guarded):
        if protocol not in ("forward", "full", "full-scaled", "backward"):
            raise ValueError(f"no timed protocol {protocol!r}")
        self.protocol, self.run, self.leaves, self.upstream, self.guarded = protocol, run, leaves, upstream, guarded
        self.loss = None
        self.before: dict = {}

    def prepare(self) -> None:
        if self.protocol != "backward":
            return
        self.loss = self.guarded("forward", self.run)
        self.guarded("backward", lambda: self.loss.backward(retain_graph=True))
        first = next(iter(self.leaves), None)
        for name, leaf in self.leaves.items():
            if name == first:
                leaf.grad = None  # grad_to_none=[_input]
            elif leaf.grad is not None:
                self.before[name] = leaf.grad.detach().clone()

    def timed(self) -> None:
        import torch  # lazily, as op_load

        if self.protocol == "forward":
            with torch.no_grad():
                self.loss = self.guarded("forward", self.run)
        elif self.protocol == "full":
            self.loss = self.guarded("forward", self.run)
            self.guarded("backward", lambda: self.loss.backward())
        elif self.protocol == "full-scaled":  # (c * loss).backward(): gradient accumulation, loss scaling
            self.loss = self.guarded("forward", self.run)
            self.guarded("backward", lambda: self.loss.backward(torch.full_like(self.loss, self.upstream)))
        else:
            self.guarded("backward", lambda: self.loss.backward(retain_graph=True))

    def gradients(self) -> dict:
        if self.protocol == "forward":
            return {}
        grads = {name: leaf.grad for name, leaf in self.leaves.items()}
        for name, old in self.before.items():  # backward: what the timed backward added
            if grads.get(name) is not None:
                grads[name] = grads[name] - old
        return grads


class _Worker:
    def __init__(self, conn: Connection, sock: socket.socket | None = None):
        self.conn, self.sock = conn, sock
        self.entry = None
        self.folder: Path | None = None
        self.params: dict[str, Any] = {}
        self.device = "cpu"
        self.slots: dict[str, dict[str, Any]] = {}
        self.calls: dict[str, dict[str, Any]] = {}
        self.flush_buffer = None
        self.watch = Watch()  # process-global state around each call (no-global-side-effects)
        self.frozen = False  # gc.freeze() done (op_load, the first load)

    # -- messages ---------------------------------------------------------------------------
    def send(self, **msg: Any) -> None:
        self.conn.send_bytes(json.dumps(msg).encode())

    def recv(self) -> dict[str, Any]:
        return json.loads(self.conn.recv_bytes().decode())

    def serve(self) -> None:
        while True:
            msg = self.recv()
            op = msg.pop("op", None)
            if op == "exit":
                return
            handler = OPS.get(op) if isinstance(op, str) else None
            if handler is None:  # only what a parent sends: no other entry into this process
                self.send(status="error", error={
                    "type": "UnknownOperation", "phase": "protocol",
                    "message": f"the worker has no operation {str(op)[:80]!r}; it accepts {', '.join(sorted(OPS))} "
                               "and exit (docs/architecture.md, Worker protocol)"})
                continue
            try:
                handler(self, **msg)
            except _CallError as exc:
                # what the call launched before raising lands before the parent writes the shared buffers again
                self._sync(str(exc.info.get("phase") or op))
                self.send(status="error", error=exc.info)
            except Exception as exc:  # a bug in the harness itself: report, keep serving
                self.send(status="error", error=_error_info(exc, self.folder, phase=op))

    # -- operations -------------------------------------------------------------------------
    def op_load(self, folder: str, name: str, entry: str, parameters: dict, device: str) -> None:
        import torch  # after harden_worker (run): the worker imports torch only once hardened

        self.folder, self.params, self.device = Path(folder), parameters, device
        if device == "cpu":
            # One intra-op thread, as the parent (check.py): the two processes take turns, and torch's
            # second thread spins between ops on the core the other one needs. Measured on the 2-core
            # machine (docs/timing.md, CPU section): one masked member of implementations/pytorch,
            # worker CPU 9.5 s -> 3.4 s.
            torch.set_num_threads(1)
        module_name, attr = entry.split(":")
        package = "grpo_impl_" + name.replace("-", "_")
        # torch's and the validator's own objects (~200k) leave the collector's generations before the
        # implementation's code runs: a full collection then visits only what was made since, so a
        # resources sample (isolation/resources.py) costs ~0.1 ms, not ~150 ms, and so does every
        # automatic collection. No collection first: it cost ~130 ms a worker, and the import garbage it
        # would free is a little memory kept. Only at the first load: a later one (the next member in this
        # worker) would also freeze what the implementation made, and frozen cycles are never collected.
        if not self.frozen:
            gc.freeze()
            self.frozen = True
        try:
            module = import_entry(folder, package, module_name)  # source only, never bytecode
        except BaseException as exc:  # SystemExit in a module body is a load failure too
            self.send(status="error", error=_error_info(exc, self.folder, phase="import"), field="entry")
            return
        fn = getattr(module, attr, None)
        if not callable(fn):
            self.send(status="error", field="entry",
                      error={"type": "AttributeError", "message": f"module {module_name!r} has no callable {attr!r}",
                             "where": f"{module_name}.py", "phase": "import"})
            return
        self.entry = fn
        triton_keys.steady()  # where the implementation imported Triton: keys independent of launch order
        info = {"torch": torch.__version__, "pid": os.getpid()}
        if device == "cuda":
            info["gpu"] = torch.cuda.get_device_name()
        self.send(status="ok", info=info)

    def op_warm(self, device: str) -> None:
        """Before `load`, validator code only: what any implementation's load and first calls pay for in a
        fresh worker (torch's import, the module its first backward imports and, on CUDA where Triton is
        installed, its compiler key: ~0.5 s of hashing Triton's own files, round35b). A timed turn's worker
        does this while its slot waits for the GPU (check._spawn_early). Nothing here touches the GPU: the
        CUDA context is made under the turn's hold, as another slot's turn may be measuring bandwidth."""
        import importlib.util  # local: this op's alone

        import torch  # noqa: F401  (after harden_worker (run), as op_load)
        import torch.fx.experimental.symbolic_shapes  # noqa: F401  (the first backward's import, ~0.6 s)

        if device == "cuda" and importlib.util.find_spec("triton") is not None:
            from triton.runtime import cache  # local: Triton is optional, and imported only here on CUDA

            key = getattr(cache, "triton_key", None)  # Triton's own key, cached for the process
            if callable(key):
                key()
            triton_keys.steady()
        self.send(status="ok")

    def op_bind(self, slot: str, tensors: dict[str, dict], nfds: int = 0) -> None:
        from grpo_conform.isolation.sharing import open_descriptor  # lazily, as op_load

        fds: dict[int, int] = {}
        if nfds:  # the memfds of this bind, in the order of the memfd descriptors
            _, received, _, _ = socket.recv_fds(self.sock, 1, nfds)
            numbers = [d["fd"] for d in tensors.values() if d.get("kind") == "memfd"]
            fds = dict(zip(numbers, received))
        try:
            self.slots[slot] = {name: open_descriptor(desc, fds) for name, desc in tensors.items()}
        finally:
            for fd in fds.values():  # the mappings stay; the descriptors are not needed
                os.close(fd)
        self.send(status="ok")

    def op_unbind(self, slots: list[str]) -> None:
        """Forget input or output slots. CUDA buffers belong to the parent (CUDA IPC): it can free one
        only after every process that opened it has let go of its storage, so a storage kept alive here
        (cyclic garbage of a call's graph, a reference the implementation kept) pins the parent's memory
        for the rest of the run. Garbage is collected here, and the reply names every slot tensor whose
        storage is still alive (`held`): the parent records it (docs/timing.md, round30a)."""
        gone = [(name, key, t) for name in slots for key, t in (self.slots.pop(name, None) or {}).items()]
        refs = []
        if self.device == "cuda":
            from torch.multiprocessing.reductions import StorageWeakRef  # lazily, as op_load

            refs = [(f"{name}.{key}", StorageWeakRef(t.untyped_storage())) for name, key, t in gone]
        del gone
        held = [label for label, ref in refs if not ref.expired()]
        if held:  # a full collection only when something is still alive (~0.1 s with torch loaded)
            gc.collect()
            held = [label for label, ref in refs if not ref.expired()]
        if self.device == "cuda":
            import torch  # lazily, as op_load

            # what the workload's calls left in this process's allocator goes back to the GPU: beside
            # other slots (gate/gpu_share.py) it is theirs to use (round32a: 139 GB of 140 in use at once)
            torch.cuda.empty_cache()
        self.send(status="ok", held=held)

    # -- a call: forward, backward and export as separate steps ------------------------------
    # The parent drives a call as forward -> (inspect inputs) -> backward -> export, so that it
    # can hold several graphs at once (two forwards before one backward), backpropagate any
    # upstream scalar, through torch.autograd.backward or torch.autograd.grad, from leaves or
    # non-leaf views of the differentiable inputs. Every call's outputs stay alive here until
    # dropped, so the parent can re-read them at the end of a workload (a ring of reused buffers
    # shows there).
    @staticmethod
    def _leaves(shared: dict[str, Any], gradients: list[str], grad: bool, leaf: str = "leaf") -> tuple[dict, dict]:
        """({name: leaf}, the call's arguments): each differentiable input (`gradients`, named by the
        parent) detached from the shared buffer (a leaf of its own), requiring grad when `grad`;
        `leaf` "view" passes a view of it (no .grad of its own), "affine" a new non-leaf tensor
        computed from it through a chain of drawn length (`_chain`)."""
        leaves = {name: shared[name].detach() for name in gradients}
        passed = dict(leaves)
        if grad:
            for name, base in leaves.items():
                base.requires_grad_(True)
                if leaf == "view":
                    passed[name] = base[..., :]
                elif leaf == "affine":
                    passed[name] = _chain(base)
        return leaves, {name: passed.get(name, t) for name, t in shared.items()}

    def op_forward(self, call: str, inputs: str, params: dict, grad: bool, gradients: list[str],
                   leaf: str = "leaf", poison: str | None = None, inference: bool = False,
                   tie: dict | None = None, local: list[str] | None = None, same: dict | None = None,
                   omit: list[str] | None = None, prefill: dict | None = None, deterministic: bool = False,
                   autocast: str | None = None) -> None:
        """`local`: inputs handed over as worker-local copies (`_local_copy`), written back after the
        call; `same` ({input: [source, how]}): that input passed as the source's own tensor (how "object"),
        a detach() of it ("detach") or a view of that ("view"); `omit`: optional inputs not passed at all;
        `prefill` ({"outputs": slot, "inputs": [names]}): each named leaf's .grad set before the forward to a copy
        of that output slot's gradient buffer (a trainer's earlier micro-batch); `deterministic`: forward and
        backward under torch.use_deterministic_algorithms(True, warn_only=True) (global_state.py); `autocast` (a
        dtype name): the forward under torch.autocast(<the worker's device>, dtype), the backward outside it, as
        PyTorch's mixed-precision recipe runs a training step."""
        import torch  # lazily, as op_load

        shared = self.slots[inputs]
        copies = {name: _local_copy(shared[name]) for name in local or () if name in shared}
        handed = {**shared, **copies}
        if poison:  # after the copies: the implementation's own allocations take the poisoned blocks
            self._poison(poison, shared, gradients)
        leaves, args = self._leaves(handed, gradients, grad, leaf)
        for name, (source, how) in (same or {}).items():
            t = args[source]
            args[name] = t if how == "object" else t.detach() if how == "detach" else t.detach()[..., :]
        for name in omit or ():
            args.pop(name, None)
        crop = self._model_slices(leaves, args) if leaf == "slice" and grad else []
        for name in (prefill or {}).get("inputs", ()) if grad else ():
            leaves[name].grad = self.slots[prefill["outputs"]][GRAD_PREFIX + name].detach().clone()
        # inference: torch.inference_mode (a serving or evaluation loop), a stricter no_grad
        grad_ctx = torch.enable_grad() if grad else torch.inference_mode() if inference else torch.no_grad()
        local = {n: (shared[n], c) for n, c in copies.items()}
        try:
            amp = torch.autocast(self.device, dtype=getattr(torch, autocast)) if autocast else contextlib.nullcontext()
            with grad_ctx, deterministic_algorithms(deterministic), amp:
                loss = self._guarded("forward", lambda: self.watch.around(call, "forward", lambda: self.entry(
                    **args, **params)))
                backprop = self._tied(loss, args, tie) if tie and grad else loss
            self._sync("forward")
        finally:  # a failed call's writes are reported too ("after error")
            _write_back(local)
        self.calls[call] = {"loss": loss, "leaves": leaves, "grads": {}, "inputs": inputs, "names": list(gradients),
                            "backprop": backprop, "crop": crop, "local": local, "deterministic": deterministic,
                            "handed": args}
        self.send(status="ok", loss=_describe(loss))

    def op_backward(self, calls: list[str], upstream: list[float], method: str = "backward",
                    poison: str | None = None, retain: bool = False, export: dict | None = None) -> None:
        """`export` ({call, outputs, keep}): that call exported right after, in the same round trip (the
        parent's plain call: forward, then backward and export; an error of the export says phase export)."""
        import torch  # lazily, as op_load

        skipped: dict[str, str] = {}
        losses, grads_in, names = [], [], []
        for name, c in zip(calls, upstream):
            entry = self.calls[name]
            loss = entry.get("backprop", entry["loss"])  # with a tie: the loss plus the tied use's term
            # A loss autograd cannot differentiate is a contract failure the parent reports.
            if not _is_tensor(loss):
                skipped[name] = "the loss is not a torch.Tensor"
            elif not _copyable(loss):  # sparse, nested or meta: the worker's own full_like would raise
                skipped[name] = (f"the loss is not a dense tensor with data (layout {_describe(loss)['layout']}, "
                                 f"device {loss.device.type})")
            elif loss.numel() != 1:
                skipped[name] = f"the loss has {loss.numel()} elements, not one"
            elif not loss.requires_grad:
                skipped[name] = ("the loss does not require grad: autograd cannot differentiate it w.r.t. "
                                 + ", ".join(entry["names"]))
            else:
                losses.append(loss)
                grads_in.append(torch.full_like(loss.detach(), float(c)))
                names.append(name)
        if losses:
            if poison:  # backward allocates the gradients: poison right before it
                first = self.calls[names[0]]
                self._poison(poison, self.slots[first["inputs"]], first["names"])
            # Every (call, input) leaf, in one flat list for torch.autograd.grad.
            pairs = [(name, key, leaf) for name in names for key, leaf in self.calls[name]["leaves"].items()]
            label = "/".join(names)
            strict = any(self.calls[name].get("deterministic") for name in names)
            try:
                with deterministic_algorithms(strict):  # set outside the watch: the validator's switch, not the call's
                    if method == "autograd.grad":
                        grads = self._guarded("backward", lambda: self.watch.around(label, "backward", lambda: torch.autograd.grad(
                            losses, [leaf for _, _, leaf in pairs], grads_in, allow_unused=True, retain_graph=retain)))
                    else:
                        self._guarded("backward", lambda: self.watch.around(label, "backward", lambda: torch.autograd.backward(
                            losses, grads_in, retain_graph=retain)))
                        grads = [leaf.grad for _, _, leaf in pairs]
                    self._sync("backward")
            finally:  # what backward wrote into a local copy reaches the parent's buffer (a failed one's too)
                for name in names:
                    _write_back(self.calls[name].get("local") or {})
            for (name, key, _), g in zip(pairs, grads):
                if g is not None and key in self.calls[name].get("crop", ()):
                    g = g[:, :-1]  # the model output's dropped last position is not the input's
                self.calls[name]["grads"][key] = g
            for name in names:
                self.calls[name]["retained"] = retain  # a second backward through this graph follows
        reply: dict[str, Any] = {"status": "ok", "skipped": skipped}
        if export is not None:
            try:
                reply["report"] = self._export(str(export["call"]), str(export["outputs"]), bool(export["keep"]))
            except _CallError:
                raise
            except Exception as exc:  # as the dispatcher reports an export op's own error
                raise _CallError(_error_info(exc, self.folder, phase="export")) from None
        self.send(**reply)

    def op_rewrite(self, call: str, source: str, names: list[str]) -> None:
        """Between a call's forward and its backward: each named input, the tensor the implementation was handed,
        written over in place with slot `source`'s values under torch.no_grad, so autograd's version counters
        count the write, as a caller refilling static input buffers before a pending backward does (probe
        `rewritten-inputs`, checks/rewritten.py: the backward must give the forward's inputs' gradient or raise)."""
        import torch  # lazily, as op_load

        handed = self.calls[call]["handed"]
        with torch.no_grad():
            for name in names:
                handed[name].copy_(self.slots[source][name])
        # the copies are asynchronous on CUDA: a backward that raises launches nothing after them, and the parent
        # then restores the shared buffer on its own stream, which a late copy overwrote (no-mutation failed RW-*
        # calls of two members on an H100, 2026-12-06: the differentiable input changed during forward)
        self._sync("rewrite")
        self.send(status="ok")

    def op_export(self, call: str, outputs: str, keep: bool = True) -> None:
        self.send(status="ok", report=self._export(call, outputs, keep))

    def op_precompile(self, slots: list[str], params: dict, gradients: list[str], threads: int = 0) -> None:
        """On each slot's inputs a forward without grad (the forward-only path), then one with grad and its
        backward, everything dropped after: the kernels of a member the slot will check next compiled while it
        checks this one (check_ahead.py). Nothing of it is judged, so an error is only named in the reply
        (conformance meets it again). `threads` > 0: Triton's kernels compiled side by side on that many
        threads and not run (isolation/compile_only.py); the reply says whether that was in effect."""
        failed, active = [], False
        try:
            with compile_only.side_by_side(threads) as active:
                for name in slots:
                    try:
                        self._precompile_one(self.slots[name], params, gradients)
                    except Exception as exc:
                        failed.append(f"{name}: {type(exc).__name__}")
        except Exception as exc:  # a compile that failed, raised on leaving the block (an older Triton's mode)
            failed.append(f"side by side: {type(exc).__name__}")
        self._sync("precompile")
        self.send(status="ok", failed=failed, side_by_side=active)

    def _precompile_one(self, shared: dict[str, Any], params: dict, gradients: list[str]) -> None:
        import torch  # lazily, as op_load

        with torch.no_grad():
            self.entry(**self._leaves(shared, gradients, False)[1], **params)
        _, args = self._leaves(shared, gradients, True)
        with torch.enable_grad():
            loss = self.entry(**args, **params)
        if _is_tensor(loss) and loss.requires_grad and loss.numel() == 1:
            torch.autograd.backward(loss)

    def _export(self, call: str, outputs: str, keep: bool) -> dict[str, Any]:
        entry = self.calls[call]
        loss, grads = entry["loss"], entry["grads"]
        shared = self.slots[entry["inputs"]]
        report = {"loss": _describe(loss), "grads": {name: _describe(grads.get(name)) for name in entry["names"]},
                  "storage": {}}
        local = entry.get("local") or {}
        for name, t in shared.items():  # a local call: the storage the implementation was handed
            report["storage"][name] = _storage_range(local[name][1] if name in local else t)
        report["storage"]["loss"] = _storage_range(loss)
        for name in entry["names"]:
            report["storage"][GRAD_PREFIX + name] = _storage_range(grads.get(name))
        self._copy_out(self.slots[outputs], loss, grads)
        self._sync("export")
        if keep:
            if not entry.get("retained"):  # a retained graph is backpropagated again from these leaves
                entry["leaves"] = {}  # outputs stay alive; the inputs' tensor objects need not
                entry.pop("backprop", None)
                entry.pop("local", None)
        else:
            del self.calls[call]
        return report

    @staticmethod
    def _model_slices(leaves: dict, args: dict) -> list[str]:
        """leaf "slice": each differentiable input of 3 or more dimensions handed over as `out[:, :-1]` of
        a leaf one position longer along dim 1 (a causal model's last hidden states, its last position
        dropped: a non-leaf, non-contiguous view); the gradient read back is the leaf's without that
        position. Returns the inputs so handled."""
        import torch  # lazily, as op_load

        done = []
        for name, base in list(leaves.items()):
            if base.dim() < 3:
                continue
            with torch.no_grad():
                longer = torch.cat([base, base[:, -1:]], dim=1)
            longer.requires_grad_(True)
            leaves[name], args[name] = longer, longer[:, :-1]
            done.append(name)
        return done

    @staticmethod
    def _tied(loss, args: dict, tie: dict):
        """The loss plus a second use of one input in the same graph (tied input embeddings):
        `scale` times the sum of an embedding lookup of rows `rows` of input `input` (the tensor passed
        to the entry). The parent knows that term's gradient (scale at each looked-up row) and
        subtracts it; only what backprops changes, the loss exported stays the entry's own."""
        import torch  # lazily, as op_load

        if not _is_tensor(loss) or not loss.requires_grad:
            return loss  # the contract check reports it; nothing to tie
        table = args[tie["input"]]
        ids = torch.tensor(tie["rows"], dtype=torch.long, device=table.device)
        return loss + float(tie["scale"]) * torch.nn.functional.embedding(ids, table).sum()

    def op_reexport(self, call: str, outputs: str) -> None:
        entry = self.calls[call]
        self._copy_out(self.slots[outputs], entry["loss"], entry["grads"])
        self._sync("reexport")
        self.send(status="ok")

    def op_effects(self) -> None:
        """What the calls since the last `effects` changed of the process's global state (global_state.py)."""
        self.send(status="ok", effects=self.watch.report())

    def op_resources(self) -> None:
        """Open file descriptors, threads, live tensors and CUDA bytes held now (resources.py)."""
        import torch  # lazily, as the other ops

        self.send(status="ok", **sample(torch))

    def op_memory_peak(self) -> None:
        """The most GPU memory this process's allocator reserved since the last ask (the peak is reset):
        what a workload's conformance cost here, beside the gate's grant (check._memory_hold)."""
        import torch  # lazily, as the other ops

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            self.send(status="ok", reserved_peak=None)
            return
        peak = int(torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        self.send(status="ok", reserved_peak=peak)

    def op_drop(self, calls: list[str] | None = None) -> None:
        for name in (list(self.calls) if calls is None else calls):
            self.calls.pop(name, None)
        self.send(status="ok")

    def op_time_setup(self, flush_bytes: int, params: dict | None = None) -> None:
        import torch  # lazily, as op_load

        from grpo_conform.timing import L2Flush  # lazily, as op_load

        if params is not None:  # the member's declared values: one worker serves every member (check.py)
            self.params = params
        self.flush_buffer = L2Flush(torch.device("cuda"), flush_bytes) if flush_bytes else None
        self.send(status="ok")

    def op_time(self, sets: list[str], protocol: str, warm: str | None, copy_from: str | None,
                outputs: str | None, gradients: list[str], upstream: float = 1.0) -> None:
        """Timed calls back to back, one per input set: an untimed call on `warm` first (the GPU
        and its clocks busy again after the parent rewrote the inputs), then for each set: flush
        L2, events on the current stream around the call, a device-wide synchronize."""
        spin = PRE_SPIN_CYCLES
        if warm is not None:
            # The untimed call measures how long the host takes to enqueue one call (autograd's
            # backward thread included); the timed calls then start behind at least 1.5x that
            # much GPU work, so host overhead stays off the clock for every implementation alike.
            spin = spin_cycles_for(self._timed_call(warm, protocol, None, spin, gradients, upstream)["enqueue_ns"])
        results = [self._timed_call(name, protocol, outputs if name == copy_from else None, spin, gradients, upstream)
                   for name in sets]
        self.send(status="ok", results=results)

    def _timed_call(self, inputs: str, protocol: str, outputs: str | None, spin: int, gradients: list[str],
                    upstream: float = 1.0) -> dict[str, int]:
        """One timed call. Before the start event the GPU is kept busy (a spin of `spin` cycles,
        then the L2 flush), so the CPU cost of launching the call's kernels is hidden as in a
        back-to-back loop; synchronizing first would leave the GPU idle at the start event and put
        launch latency on the clock. Host wall time minus that pre-work bounds the call from above
        (side streams)."""
        import torch  # lazily, as op_load

        shared = self.slots[inputs]
        leaves, args = self._leaves(shared, gradients, protocol != "forward")
        step = TimedSteps(protocol, lambda: self.entry(**args, **self.params), leaves, upstream, self._guarded)
        step.prepare()  # untimed: backward's forward and first backward
        torch.cuda.synchronize()
        base = _allocated_bytes("current")
        torch.cuda.reset_peak_memory_stats()
        pre, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        wall0 = time.perf_counter_ns()
        pre.record()
        torch.cuda._sleep(int(spin))
        if self.flush_buffer is not None:
            self.flush_buffer(wall0)
        start.record()
        step.timed()
        end.record()
        enqueued = time.perf_counter_ns()
        self._sync("timed call")
        wall1 = time.perf_counter_ns()
        peak = _allocated_bytes("peak") - base  # before gradients(): backward's subtraction is not the call's
        loss, grads = step.loss, step.gradients()
        event_ns = int(round(start.elapsed_time(end) * 1e6))
        pre_ns = int(round(pre.elapsed_time(start) * 1e6))
        if outputs is not None:
            self._copy_out(self.slots[outputs], loss, grads)
            self._sync("copy")
        del loss, grads, leaves, step
        return {"event_ns": event_ns, "wall_ns": max(0, wall1 - wall0 - pre_ns), "pre_ns": pre_ns,
                "enqueue_ns": enqueued - wall0, "peak_bytes": int(peak)}

    # -- helpers ----------------------------------------------------------------------------
    def _guarded(self, phase: str, fn):
        try:
            return fn()
        except Exception as exc:
            raise _CallError(_error_info(exc, self.folder, phase=phase)) from None

    def _sync(self, phase: str) -> None:
        import torch  # lazily, as op_load

        if self.device != "cuda":
            return
        try:
            torch.cuda.synchronize()
        except Exception as exc:  # a CUDA error poisons the context: report and leave
            self.send(status="error", fatal=True, error=_error_info(exc, self.folder, phase=phase))
            sys.stderr.flush()
            os._exit(70)

    def _poison(self, kind: str, shared: dict[str, Any], gradients: list[str]) -> None:
        """Fill blocks of every size with a byte pattern and free them, so the next allocations
        (of any size) start poisoned instead of holding stale values.

        Small blocks of a geometric series of sizes use up the allocator's free lists (glibc bins
        on the CPU, torch's small and large pools on CUDA); one large block covers big outputs
        (sized by the largest differentiable input: its gradient is that size).
        CUDA: torch's caching allocator hands the freed blocks to the next allocations. CPU: the
        worker runs with glibc's mmap threshold raised (see session.worker_environment), so large
        allocations come from the heap and reuse freed blocks instead of fresh zero pages.
        """
        import torch  # lazily, as op_load

        sized = [shared[n] for n in gradients if n in shared] or list(shared.values())
        largest = max(sized, key=lambda t: t.numel() * t.element_size())
        nbytes = largest.numel() * largest.element_size()
        device = largest.device
        blocks = []
        size = 512
        while size <= min(4 * nbytes, 64 << 20):
            blocks += [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(6)]
            size *= 2
        big = 3 * nbytes + (64 << 20)
        if self.device == "cuda":
            # Hand every cached free block back first, so the poisoned ones are all that is cached.
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info()
            big = int(min(big, 0.5 * free))
        blocks.append(torch.empty(big, dtype=torch.uint8, device=device))
        for block in blocks:
            block.fill_(POISON_BYTES[kind])
        del blocks

    def _copy_out(self, slot: dict[str, Any], loss, grads: dict[str, Any]) -> None:
        """The loss into slot["loss"], each gradient into its own buffer; NaN where there is none
        (or its shape is wrong: the parent's contract check reports the shape)."""
        import torch  # lazily, as op_load

        if _copyable(loss) and loss.numel() >= 1:
            first = loss.detach()[(0,) * loss.dim()]  # a view: reshape(-1) would copy an expanded loss whole
            slot["loss"].copy_(first.reshape(1).to(torch.float64))
        else:
            slot["loss"].fill_(float("nan"))
        for key, buffer in slot.items():
            if not key.startswith(GRAD_PREFIX):
                continue
            grad = grads.get(key[len(GRAD_PREFIX):])
            if _copyable(grad) and tuple(grad.shape) == tuple(buffer.shape):
                buffer.copy_(grad.detach())
            else:
                buffer.fill_(float("nan"))


#: The operations a parent sends (`exit` aside, handled by the loop); nothing else is dispatched.
OPS = {
    "warm": _Worker.op_warm,
    "load": _Worker.op_load,
    "bind": _Worker.op_bind,
    "unbind": _Worker.op_unbind,
    "forward": _Worker.op_forward,
    "backward": _Worker.op_backward,
    "export": _Worker.op_export,
    "rewrite": _Worker.op_rewrite,
    "precompile": _Worker.op_precompile,
    "reexport": _Worker.op_reexport,
    "effects": _Worker.op_effects,
    "resources": _Worker.op_resources,
    "memory_peak": _Worker.op_memory_peak,
    "drop": _Worker.op_drop,
    "time_setup": _Worker.op_time_setup,
    "time": _Worker.op_time,
}


class _CallError(Exception):
    def __init__(self, info: dict[str, Any]):
        super().__init__(info["message"])
        self.info = info


MAX_DIMS = 64  # a described shape has at most this many dimensions (messages.Described); more: no shape


def _describe(x: Any) -> dict[str, Any] | None:
    """What an output is, within the reply model's bounds (messages.Described): any value the
    implementation returns, however odd, is described, never a reason for the worker's own code to
    raise (issue: hostile outputs). A name too long is cut; a nested tensor, which has no sizes, and a
    tensor of more than MAX_DIMS dimensions get no shape; `layout` is "nested" for a nested tensor."""
    import torch  # lazily, as op_load

    if x is None:
        return None
    name = _cut(f"{type(x).__module__}.{type(x).__qualname__}")
    if not _is_tensor(x):
        return {"type": name, "exact_tensor": False}
    nested = bool(x.is_nested)
    try:  # a subclass can override .shape with anything
        shape = None if nested or x.dim() > MAX_DIMS else [int(d) for d in x.shape][:MAX_DIMS + 1]
    except Exception:
        shape = None
    shape = shape if shape is None or len(shape) <= MAX_DIMS else None
    return {
        "type": name,
        "exact_tensor": type(x) is torch.Tensor,
        "dtype": str(x.dtype).replace("torch.", ""),
        "shape": shape,
        "device": x.device.type,
        "layout": "nested" if nested else str(x.layout).replace("torch.", ""),
        "requires_grad": bool(x.requires_grad),
        "has_grad_fn": x.grad_fn is not None,
    }


def _chain(base: Any) -> Any:
    """`base` through a chain of value-preserving differentiable steps (x * 1.0, x + 0.0, a clone), of a length
    drawn per call in 2..32: a model's outputs are many autograd nodes from a leaf, and a kernel that counted the
    nodes to a leaf (a single `* 1.0` before the adversarial round of 2026-12-05) took that for the validator.
    No view step: a sparse gradient an implementation hands back must reach the contract check, not break here."""
    t = base
    for step in os.urandom(2 + os.urandom(1)[0] % 31):
        t = t * 1.0 if step % 3 == 0 else t + 0.0 if step % 3 == 1 else t.clone()
    return t


def _local_copy(t: Any) -> Any:
    """What `t` (a slot tensor: memfd or CUDA IPC memory) holds, as an ordinary tensor of this process:
    torch's own allocator (a resizable storage, not page-aligned, not shared), version 0, the same shape,
    strides, offset and storage size (a view's padding, PAD_BYTE, copied too). A tensor that fills its
    storage is a clone (no `_base`, as a trainer's own tensor); a view into a larger buffer stays a view
    of a fresh flat tensor (`_base` set, as `input_ids[:, P:]` has). A slot tensor differs from a
    trainer's in all of these; a call that hands these over is one the implementation cannot tell from
    a trainer's by its inputs' memory, and the parent picks such calls in secret (checks/local_inputs.py)."""
    s, size = t.untyped_storage(), t.element_size()
    n = s.nbytes() // size
    if (t.storage_offset() == 0 and t.is_contiguous() and t.numel() == n) or s.nbytes() % size:
        return t.detach().clone()
    flat = t.detach().as_strided((n,), (1,), 0).clone()
    return flat.as_strided(t.shape, t.stride(), t.storage_offset())


def _write_back(local: dict[str, Any]) -> None:
    """Each local copy's bytes (padding included) into the slot buffer it was made from, so that the
    parent's mutation check sees whatever the implementation wrote into its inputs on a local call."""
    for shared, copy in local.values():
        shared.untyped_storage().copy_(copy.untyped_storage())


def _is_tensor(x: Any) -> bool:
    """A torch.Tensor by its real type: isinstance reads `__class__`, which any object can fake."""
    import torch  # lazily, as op_load

    return issubclass(type(x), torch.Tensor)


def _cut(name: str, most: int = 200) -> str:
    """A class name the implementation chose, cut to fit the reply model's short texts (300)."""
    return name if len(name) <= most else name[:most - 3] + "..."


def _copyable(x: Any) -> bool:
    """A tensor whose values the worker can copy into a dense output buffer: strided (not sparse, not
    nested), with data (not on the meta device). Anything else is copied out as NaN; the contract
    check reports why from its description."""
    import torch  # lazily, as op_load

    return (_is_tensor(x) and x.layout == torch.strided and not x.is_nested
            and x.device.type != "meta")


def _storage_range(x: Any) -> list[int] | None:
    import torch  # lazily, as op_load

    if not _is_tensor(x):
        return None
    try:
        s = x.untyped_storage()
        return [int(s.data_ptr()), int(s.nbytes())]
    except Exception:  # tensor subclasses without storage
        return None


TRACEBACK_FRAMES = 8  # frames of an implementation's exception shown to its author


def _error_info(exc: BaseException, folder: Path | None, phase: str) -> dict[str, Any]:
    """Type, message and the innermost frame inside the implementation folder (file:line)."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if folder is not None:
        inside = [f for f in frames if str(f.filename).startswith(str(folder))]
        if inside:
            f = inside[-1]
            where = f"{Path(f.filename).relative_to(folder)}:{f.lineno}"
    if not where and frames:
        f = frames[-1]
        where = f"{f.filename}:{f.lineno}"
    message = str(exc) if str(exc) else repr(exc)
    # The last frames (the worker's own dispatch frames dropped), for the author: REPORT, issue 16.
    shown = [f for f in frames if not str(f.filename).endswith("isolation/worker.py")][-TRACEBACK_FRAMES:] or frames[-1:]
    text = "".join(traceback.format_list(shown)) + "".join(traceback.format_exception_only(type(exc), exc))
    if folder is not None:  # the author's own file names, not the staging folder's
        text = text.replace(str(folder).rstrip("/") + "/", "")
    return {"type": _cut(type(exc).__name__), "message": message[:2000], "where": where, "phase": phase,
            "traceback": text[-4000:]}


def run(fd: int, malloc: bool) -> None:
    """Serve the parent on socket `fd` (started by session._Start through multiprocessing's spawn
    bootstrap, so the process looks like any spawn child), then leave without teardown."""
    harden_worker(malloc)
    sock = socket.socket(fileno=fd)
    worker = _Worker(Connection(os.dup(fd)), sock)
    profile = _profiler()
    try:
        worker.serve()
    except (EOFError, ConnectionError):
        pass
    finally:
        if profile is not None:
            profile.disable()
            try:
                profile.dump_stats(os.path.join(os.environ[PROFILE_ENV], f"worker-{os.getpid()}.prof"))
            except OSError as exc:  # an unwritable DIR loses the profile, not the worker's clean exit
                print(f"grpo-conform worker: profile not written: {exc}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: an implementation's threads must not hang the exit


def _profiler():
    """`GRPO_CONFORM_WORKER_PROFILE=DIR` (the validator's own switch, for finding where a worker round
    trip's time goes; never for a record): the worker runs under cProfile and writes
    DIR/worker-PID.prof when it leaves. DIR must be writable by the worker's user and not under /tmp or
    another world-writable place the worker gets a private, empty copy of (isolation/namespaces.py)."""
    folder = os.environ.get(PROFILE_ENV)
    if not folder:
        return None
    import cProfile  # only with the switch set: nothing more in a worker's modules otherwise
    from pathlib import Path  # (as cProfile: only with the switch set)

    from grpo_conform.sampler import stack_dumps  # (as cProfile: only with the switch set)

    stack_dumps(Path(folder) / f"worker-{os.getpid()}.stacks")  # a hung worker never reaches the profile's dump
    profile = cProfile.Profile()
    profile.enable()
    return profile


def _allocated_bytes(which: str) -> int:
    """torch.cuda.memory_allocated() ("current") or max_memory_allocated() ("peak"), the same numbers without
    flattening every allocator statistic into a dict of ~300 keys first (~0.5 ms a call, twice per timed
    call: ~1 s of a timed turn's worker, round35b's profile)."""
    import torch  # lazily, as op_load

    return int(torch.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"][which])


def main() -> None:
    run(int(sys.argv[1]), malloc=False)


if __name__ == "__main__":
    main()
