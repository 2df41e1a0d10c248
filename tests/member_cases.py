"""Small CPU cases for every member of the family `grpo`: inputs that exercise its semantics (ratios in
both clip regions and the unclipped one, kept away from the boundaries; padded, fully masked and fully
unmasked rows), the member's parameters, and a comparison with the float64 reference.

Shared by tests/test_members.py (bundled implementations pass) and tests/test_gallery_members.py (each
member gallery folder fails), and run inside a TRITON_INTERPRET=1 subprocess for Liger."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from grpo_conform.ops.grpo_logits.reference import GrpoParameters, reference_gradient_dense, reference_loss
from grpo_conform.spec import Spec, load_family, load_member

ROOT = Path(__file__).resolve().parent.parent
FAMILY = ROOT / "specs" / "grpo.v1.json"
B, S, V = 4, 7, 41
LENGTHS = (4, 7, 0, 2)  # padded, full, fully masked, short
TEMPERATURE = 0.8  # away from 1, as the validator draws it


def member_names() -> list[str]:
    return list(load_family(FAMILY).member_names)


def member_spec(name: str) -> Spec:
    return load_member(FAMILY, name)


def load_impl(folder: Path) -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location(f"impl_{folder.name.replace('-', '_')}", folder / "impl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.grpo_loss


def _away_from(r: torch.Tensor, bounds: list[float], margin: float = 0.03) -> torch.Tensor:
    for b in bounds:
        near = (r - b).abs() < margin * b
        r = torch.where(near, b * (1 + 2 * margin * torch.sign(r - b + 1e-12)), r)
    return r


def make_inputs(spec: Spec, seed: int = 0, values: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """float32 logits and every optional input the member declares, ratios spread over [0.45, 1.9]."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, S + 1, V, generator=g) * 2.0
    ids = torch.randint(0, V, (B, S), generator=g)
    adv = torch.tensor([1.3, -0.8, 0.6, -0.4])  # both signs, a clearly non-zero mean
    z = logits[:, :S].double() / TEMPERATURE
    logp = (z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, -1))
    p = values if values is not None else member_parameters(spec, seed)
    eps_lo, eps_hi = float(p.get("epsilon_low", 0.2)), float(p.get("epsilon_high", 0.2))
    r = torch.empty(B, S, dtype=torch.float64).uniform_(0.45, 1.9, generator=g)
    r = _away_from(r, [1 - eps_lo, 1 + eps_hi] + ([float(p["delta"])] if "delta" in p else []))
    if p.get("loss_type") == "vespo":  # its weight sees the sequence's product of ratios: keep it near 1
        r = torch.exp(r.log() * (2.0 / S))
    names = {t.name for t in spec.inputs}
    x = {"logits": logits, "completion_ids": ids, "advantages": adv}
    mask = torch.arange(S).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)
    if "completion_mask" in names:
        x["completion_mask"] = mask
    if "old_logprobs" in names:
        x["old_logprobs"] = (logp - r.log()).float()
    if "ref_logprobs" in names:
        x["ref_logprobs"] = (logp + 0.3 * torch.randn(B, S, generator=g, dtype=torch.float64)).float()
    if "sampling_ratio" in names:
        cap = float(p.get("sampling_ratio_cap", 3.0))
        x["sampling_ratio"] = torch.empty(B, S).uniform_(0.3, 1.6 * cap, generator=g)
        if str(p.get("vllm_importance_sampling_mode", "")).startswith("sequence"):
            # TRL's sequence modes: each sequence's kept ratios multiply to 0.6 cap or 1.5 cap, alternately
            q = x["sampling_ratio"].double()
            for b, n in enumerate(LENGTHS):
                if n:
                    prod = float(torch.log(q[b, :n]).sum().exp())
                    q[b, :n] = q[b, :n] * ((0.6 if b % 2 == 0 else 1.5) * cap / prod) ** (1.0 / n)
            x["sampling_ratio"] = q.float()
    return x


def member_parameters(spec: Spec, seed: int = 0) -> dict[str, Any]:
    """The member's parameters drawn inside their `draw` ranges (as the validator draws them, so a
    hard-coded default cannot pass), temperature fixed away from 1."""
    values = dict(spec.parameter_values)
    frac = (0.37, 0.71, 0.18)[seed % 3]
    for param in spec.parameters:
        if param.draw is not None and param.name != "temperature":
            v = param.draw.min + frac * (param.draw.max - param.draw.min)
            values[param.name] = round(v) if param.type == "int" else v
    values["temperature"] = TEMPERATURE
    if "num_items_in_batch" in values:
        values["num_items_in_batch"] = 40  # over num_processes: a normaliser unlike this batch's 13 tokens
        if "gradient_accumulation_steps" in values and seed % 2:
            values["num_items_in_batch"] = 3  # TRL's max(1, N) / P differs from max(1, N / P) below P (6 here)
    return values


@dataclass(frozen=True)
class Comparison:
    loss: float
    reference_loss: float
    grad_error: float  # max |g - g_ref| / (max |g_ref|)
    masked_grad_max: float  # max |g| over masked rows (must be exactly 0)

    @property
    def loss_ok(self) -> bool:
        return abs(self.loss - self.reference_loss) <= 1e-5 * max(1.0, abs(self.reference_loss))

    @property
    def gradient_ok(self) -> bool:
        return self.grad_error <= 1e-4 and self.masked_grad_max == 0.0


def compare(fn: Callable[..., Any], spec: Spec, seed: int = 0) -> Comparison:
    values = member_parameters(spec, seed)
    x = make_inputs(spec, seed, values)
    leaf = x["logits"].clone().requires_grad_()
    loss = fn(**{**x, "logits": leaf}, **values)
    loss.backward()
    p = GrpoParameters.from_spec(spec, values)
    ref_loss = reference_loss(x, p)
    ref = reference_gradient_dense(x, p)
    scale = float(ref.abs().max()) or 1.0
    err = float((leaf.grad.double() - ref).abs().max()) / scale
    masked = torch.zeros(B, S + 1, dtype=torch.bool)
    if "completion_mask" in x:
        masked[:, :S] = ~x["completion_mask"]
    masked[:, S] = True
    masked_max = float(leaf.grad[masked].abs().max()) if bool(masked.any()) else 0.0
    return Comparison(float(loss.detach()), ref_loss, err if math.isfinite(err) else math.inf, masked_max)
