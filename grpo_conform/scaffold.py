"""`grpo-conform init MEMBER DIR`: a new implementation folder for one spec member.

Writes implementation.toml and impl.py: a plain eager PyTorch version of exactly that member,
assembled from what its resolved spec says (inputs, parameters, ratio level, policy, correction,
KL term, reduction), one commented step per semantic choice. It passes `check`, so a kernel
author starts from something conformant and replaces it step by step. The generated source
must not name this package: the tamper scan would (rightly) fail it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_conform.errors import GrpoConformError
from grpo_conform.ops import operation_name
from grpo_conform.spec import Spec, SpecError, find_family

FAMILY = "grpo"
STARTER_OPERATION = "grpo-logits"  # the operation starter_source writes an implementation of


class InitError(GrpoConformError):
    """The folder cannot be written (files already there) or the member is unknown."""


@dataclass(frozen=True)
class InitRequest:
    member: str
    folder: Path
    name: str | None = None  # the implementation's name; default: the folder's name
    family: str = FAMILY
    force: bool = False  # overwrite implementation.toml / impl.py if they exist


@dataclass(frozen=True)
class InitResult:
    folder: Path
    files: tuple[Path, ...]
    spec: Spec


def member_spec(family: str, member: str) -> Spec:
    fam = find_family(family)
    if fam is None:
        raise InitError(f"no spec family {family!r} found (set GRPO_CONFORM_SPECS to a folder holding its file)")
    if member not in fam.member_names:
        raise InitError(f"unknown member {member!r} of family {family!r} (members: {', '.join(fam.member_names)})")
    return fam.member(member)


def run_init(request: InitRequest) -> InitResult:
    spec = member_spec(request.family, request.member)
    if operation_name(spec) != STARTER_OPERATION:  # the starter below is written for GRPO over logits only
        raise InitError(f"{request.family}/{request.member}: `init` writes starters for the {STARTER_OPERATION} "
                        f"operation only; this member's operation is {operation_name(spec)!r}: start from an "
                        "implementation folder of that operation instead")
    folder = Path(request.folder)
    name = request.name or folder.resolve().name.lower()
    files = {folder / "implementation.toml": manifest_text(spec, name), folder / "impl.py": starter_source(spec)}
    existing = [str(f) for f in files if f.exists()]
    if existing and not request.force:
        raise InitError(f"{', '.join(existing)} already exist(s): choose an empty folder or pass --force")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return InitResult(folder, tuple(files), spec)


def manifest_text(spec: Spec, name: str) -> str:
    assert spec.family is not None
    return (
        "# What `grpo-conform check` reads (docs/spec-family.md). Fields:\n"
        "#   name: lowercase letters, digits and dashes; spec: the family id; members: the members this\n"
        "#   implementation claims (each is checked on its own workloads); entry: module:callable in this\n"
        "#   folder; devices: where it runs (cpu, cuda); requires: top-level modules it needs (a missing one\n"
        "#   makes check skip it, exit 3), e.g. requires = [\"triton\"].\n"
        f'name = "{name}"\n'
        f'spec = "{spec.family.id}"\n'
        f'members = ["{spec.family.member}"]\n'
        'entry = "impl:grpo_loss"\n'
        'language = "python"\n'
        'license = "Apache-2.0"\n'
        'devices = ["cpu", "cuda"]\n'
        f'description = "Starting point for {spec.family.id}/{spec.family.member}: eager PyTorch, float32 math"\n'
    )


def starter_source(spec: Spec) -> str:
    """impl.py for one member; every branch below is a semantic choice the spec makes for it."""
    sem, params = spec.semantics, spec.parameter_values
    inputs = [t.name for t in spec.inputs]
    has = set(inputs)
    required = [t.name for t in spec.inputs if not t.optional]
    optional = [t.name for t in spec.inputs if t.optional]
    signature = ", ".join(required + [f"{n}=None" for n in optional] + [f"{k}={v!r}" for k, v in params.items()])
    member = f"{spec.family.id}/{spec.family.member}" if spec.family else spec.id
    out = [f'"""{member}: a starting implementation written by `grpo-conform init`.',
           "",
           "Plain eager PyTorch, every step in float32 whatever the logits dtype; it passes",
           "`grpo-conform check` for this member. Replace it step by step with your kernel and re-run",
           "check after each step. `grpo-conform spec show SPEC_FILE --member "
           f"{spec.family.member if spec.family else spec.id}` prints the member's full contract.",
           '"""', "", "import torch", "", "",
           f"def grpo_loss({signature}):"]
    body: list[str] = []
    add = body.append
    for key in ("loss_type", "importance_sampling_level"):
        if key in params:  # a selector whose value this member fixes: refuse any other rather than guess
            add(f"if str({key}).replace('-', '_') != {str(params[key]).replace('-', '_')!r}:")
            add(f"    raise ValueError(f\"this implementation does {key}={params[key]!r} only, got {{{key}!r}}\")")
    add("# 1. Log-probabilities of the sampled tokens. logits has seq + 1 rows per sequence: the last")
    add("#    one (the token after the completion) is never read, and its gradient must be exactly 0.")
    add("seq = completion_ids.shape[1]")
    add("z = logits[:, :seq, :].float() / temperature")
    add("logp = torch.log_softmax(z, dim=-1).gather(-1, completion_ids.long().unsqueeze(-1)).squeeze(-1)")
    if "completion_mask" in has:
        add("# 2. The mask (bool or integer): masked positions contribute nothing and get a zero gradient.")
        add("if completion_mask is None:")
        add("    keep = torch.ones_like(logp, dtype=torch.bool)")
        add("else:")
        add("    keep = completion_mask != 0")
    else:
        add("# 2. No mask in this member: every position counts.")
        add("keep = torch.ones_like(logp, dtype=torch.bool)")
    add("m = keep.float()")
    if "old_logprobs" in has:
        add("# 3. The log-ratio against the behaviour policy; 0 at masked positions, so nothing there can")
        add("#    overflow in exp or reach the gradient.")
        add("old = logp.detach() if old_logprobs is None else old_logprobs.float()")
    else:
        add("# 3. On-policy: the old log-probs are the detached log-probs, so the ratio is exactly 1 and")
        add("#    still carries the gradient of logp (without the detach the gradient would be 0).")
        add("old = logp.detach()")
    add("log_ratio = torch.where(keep, logp - old, torch.zeros_like(logp))")
    if sem.importance_sampling == "sequence":
        add("# 4. Sequence-level ratio (GSPO): exp of each sequence's mean log-ratio over its kept tokens.")
        add("per_sequence = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)")
        add("ratio = torch.exp(per_sequence).unsqueeze(-1).expand_as(logp)")
    else:
        add("# 4. Token-level importance ratio.")
        add("ratio = torch.exp(log_ratio)")
    add("adv = advantages.float().unsqueeze(-1)")
    if sem.policy == "sapo":
        add("# 5. SAPO: a soft gate instead of the clip, 4/tau * sigmoid(tau * (r - 1)), with tau by the sign of")
        add("#    the advantage (A > 0: sapo_temperature_pos, else sapo_temperature_neg); r keeps its gradient.")
        add("tau = torch.where(adv > 0, torch.full_like(adv, sapo_temperature_pos), torch.full_like(adv, sapo_temperature_neg))")
        add("per_token = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv")
    elif sem.policy == "vespo":
        add("# 5. VESPO: a constant (detached) weight per sequence, phi = exp(lam + k*u - lam*exp(u)), u the")
        add("#    sequence's summed log-ratio (each token's clamped to [-20, 20], the sum to [log 1e-8, 20]);")
        add("#    (k, lam) by the sign of the advantage (A >= 0: the _pos pair). The gradient flows through logp.")
        add("with torch.no_grad():")
        add("    u = (log_ratio.clamp(-20.0, 20.0) * m).sum(-1, keepdim=True).clamp(-18.420680743952367, 20.0)")
        add("    k = torch.where(adv >= 0, torch.full_like(adv, vespo_k_pos), torch.full_like(adv, vespo_k_neg))")
        add("    lam = torch.where(adv >= 0, torch.full_like(adv, vespo_lambda_pos), torch.full_like(adv, vespo_lambda_neg))")
        add("    phi = torch.exp(lam.clamp(min=1e-4) * (1.0 - torch.exp(u)) + k * u).nan_to_num(0.0, 0.0, 0.0)")
        add("per_token = -phi * adv * logp")
    elif sem.policy == "cispo":
        add("# 5. CISPO: the ratio, capped at epsilon_high, is a constant weight (detached); the gradient")
        add("#    flows through logp only.")
        add("weight = torch.clamp(ratio, max=epsilon_high).detach()")
        add("per_token = -weight * adv * logp")
    else:
        add("# 5. Clipped surrogate. At an exact tie of the two branches the unclipped one is active (its")
        add("#    gradient passes): torch.where on >= says so instead of relying on torch.minimum's split.")
        if "delta" in params:
            add("coef_1 = torch.clamp(ratio, max=delta)  # two-sided clipping: the unclipped ratio is capped at delta")
        else:
            add("coef_1 = ratio")
        add("coef_2 = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)")
        add("unclipped, clipped = coef_1 * adv, coef_2 * adv")
        add("per_token = -torch.where(clipped >= unclipped, unclipped, clipped)")
    if sem.correction == "vllm-truncate":
        add("# 6. Sampling correction (vLLM importance sampling, truncated): a per-token weight, capped.")
        add("per_token = per_token * torch.clamp(sampling_ratio.float(), max=sampling_ratio_cap)")
    elif sem.correction != "none":  # TRL's other modes (issue 33)
        add(f"# 6. Sampling correction (vLLM importance sampling, TRL's {sem.correction[5:].replace('-', '_')}).")
        add("rho = sampling_ratio.float()")
        if "sequence" in sem.correction:
            add("#    One ratio per sequence: exp of the sum of the kept tokens' log-ratios.")
            add("rho = torch.exp(torch.where(keep, torch.log(rho), torch.zeros_like(rho)).sum(-1, keepdim=True))")
        if sem.correction.endswith("mask"):
            add("rho = torch.where(rho > sampling_ratio_cap, torch.zeros_like(rho), rho)  # above the cap: 0")
        else:
            add("rho = torch.clamp(rho, max=sampling_ratio_cap)")
        add("per_token = per_token * rho")
    if spec.terms.kl.present:
        add("# 7. KL(policy || reference), k3 estimator exp(d) - d - 1 with d = ref - logp, times beta.")
        add("ref = torch.where(keep, ref_logprobs.float(), logp.detach())")
        add("d = ref - logp")
        if params.get("use_bias_correction_kl"):
            add("#    Bias correction (TRL 1.16's default): times the ratio, which keeps its gradient.")
            add("per_token = per_token + beta * (torch.exp(d) - d - 1.0) * ratio")
        else:
            add("per_token = per_token + beta * (torch.exp(d) - d - 1.0)")
    add("per_token = torch.where(keep, per_token, torch.zeros_like(per_token))")
    add(f"# 8. Reduction ({sem.reduction}).")
    body.extend(_reduction(sem.reduction))
    out.extend("    " + line for line in body)
    return "\n".join(out) + "\n"


def _reduction(reduction: str) -> list[str]:
    if reduction == "grpo":
        return ["# Mean over each sequence's kept tokens, then mean over sequences.",
                "return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()"]
    if reduction == "bnpo":
        return ["# Sum over the batch divided by the batch's kept-token count.",
                "return per_token.sum() / m.sum().clamp(min=1.0)"]
    if reduction == "dr_grpo":
        return ["# Dr. GRPO: a constant normaliser, batch size times the maximum completion length.",
                "return per_token.sum() / (completion_ids.shape[0] * max_completion_length)"]
    if reduction == "dapo":
        return ["# Token-level: the sum divided by this batch's kept-token count.",
                "return per_token.sum() / m.sum().clamp(min=1.0)"]
    if reduction == "dapo_trl":
        return ["# TRL 1.16 in training: the generation batch's token count (at least 1) per process, times",
                "# the accumulation factor.",
                "return per_token.sum() / (max(1.0, float(num_items_in_batch)) / float(num_processes)",
                "                          * gradient_accumulation_steps / steps_per_generation)"]
    if reduction == "luspo":
        return ["# LUSPO: each sequence's sum over its kept tokens (its mean times its length), then the batch mean.",
                "return per_token.sum(-1).mean()"]
    if reduction == "dapo_global":
        return ["# Token-level over the whole generation batch: its token count per process.",
                "return per_token.sum() / max(1.0, float(num_items_in_batch) / float(num_processes))"]
    raise SpecError("(init)", "$.semantics.reduction", f"no starter for reduction {reduction!r}")
