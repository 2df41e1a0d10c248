"""Cross-references of a format-2 (resolved family member) spec that the JSON Schema cannot express.

Called from `grpo_conform.spec.documents.validate_document` after the schema passed; `fail(path, problem)`
raises the `SpecError` (so this module imports nothing of the spec package).
"""

from __future__ import annotations

from typing import Any, Callable

from grpo_conform.spec.operation_inputs import requirements_for

# Every parameter a grpo member may declare (the call convention, docs/architecture.md s. 2).
KNOWN_PARAMETERS = {
    "epsilon_low", "epsilon_high", "temperature", "loss_type", "importance_sampling_level", "beta",
    "max_completion_length", "delta", "sampling_ratio_cap", "num_items_in_batch", "num_processes",
    "use_bias_correction_kl", "vllm_importance_sampling_mode", "gradient_accumulation_steps", "steps_per_generation",
    # sapo and vespo (TRL 1.16's names)
    "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg",
}
# parameters that belong to one loss type (declared with it and only with it)
_OWN_PARAMETERS = {"sapo": ("sapo_temperature_pos", "sapo_temperature_neg"),
                   "vespo": ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")}
# loss_type -> the reductions it may be stated with
_REDUCTIONS = {"grpo": {"grpo"}, "bnpo": {"bnpo"}, "dr_grpo": {"dr_grpo"}, "dapo": {"dapo", "dapo_global", "dapo_trl"}, "cispo": {"dapo", "dapo_global"},
               "sapo": {"grpo"}, "luspo": {"luspo"}, "vespo": {"dapo"}}
_TYPES = {"float": (int, float), "int": (int,), "bool": (bool,), "str": (str,)}

Fail = Callable[[str, str], None]


def _in_domain(value: Any, domain: dict[str, Any]) -> bool:
    if "choices" in domain:
        return value in domain["choices"]
    if isinstance(value, (bool, str)):
        return False
    lo, hi = domain.get("min"), domain.get("max")
    if lo is not None and (value < lo or (domain.get("min_exclusive") and value == lo)):
        return False
    if hi is not None and (value > hi or (domain.get("max_exclusive") and value == hi)):
        return False
    return True


def check_parameters(doc: dict[str, Any], fail: Fail) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for i, p in enumerate(doc["parameters"]):
        where = f"$.parameters[{i}]"
        if p["name"] not in KNOWN_PARAMETERS:
            fail(f"{where}.name", f"unknown parameter {p['name']!r}; a grpo member may declare {sorted(KNOWN_PARAMETERS)}")
        v = p["value"]
        ok = isinstance(v, _TYPES[p["type"]]) and not (p["type"] in ("int", "float") and isinstance(v, bool))
        if not ok:
            fail(f"{where}.value", f"got {v!r}, expected a value of type {p['type']}")
        if not _in_domain(v, p["domain"]):
            fail(f"{where}.value", f"the default {v!r} is outside the parameter's domain {p['domain']}")
        draw = p.get("draw")
        if draw is not None:
            if p["type"] not in ("float", "int"):
                fail(f"{where}.draw", "only float and int parameters are drawn; fix the value with a one-choice domain")
            if draw["max"] < draw["min"]:
                fail(f"{where}.draw", "max must not be below min")
            if not (_in_domain(draw["min"], p["domain"]) and _in_domain(draw["max"], p["domain"])):
                fail(f"{where}.draw", f"the draw range [{draw['min']}, {draw['max']}] leaves the domain {p['domain']}")
        values[p["name"]] = v
    for required in ("epsilon_low", "epsilon_high", "temperature"):
        if required not in values:
            fail("$.parameters", f"every grpo member declares {required!r}")
    return values


def check_member(doc: dict[str, Any], fail: Fail) -> None:
    values = check_parameters(doc, fail)
    inputs = {t["name"] for t in doc["inputs"]}
    sem, terms = doc["semantics"], doc["terms"]
    loss_type = values.get("loss_type", "grpo")
    if sem["reduction"] not in _REDUCTIONS.get(loss_type, set()):
        fail("$.semantics.reduction", f"{sem['reduction']!r} does not go with loss_type {loss_type!r}")
    if (sem["reduction"] in ("dapo_global", "dapo_trl")) != ("num_items_in_batch" in values):
        fail("$.semantics.reduction", "reduction dapo_global goes with (and only with) the num_items_in_batch parameter")
    accum = ("gradient_accumulation_steps" in values, "steps_per_generation" in values)
    if (sem["reduction"] == "dapo_trl") != accum[0] or accum[0] != accum[1]:
        fail("$.semantics.reduction", "reduction dapo_trl goes with (and only with) gradient_accumulation_steps and "
             "steps_per_generation")
    if ("num_items_in_batch" in values) != ("num_processes" in values):
        fail("$.parameters", "num_items_in_batch and num_processes are declared together")
    if (sem.get("policy", "clip") == "cispo") != (loss_type == "cispo"):
        fail("$.semantics.policy", "policy cispo goes with (and only with) loss_type cispo")
    for own, names in _OWN_PARAMETERS.items():
        if (sem.get("policy", "clip") == own) != (loss_type == own):
            fail("$.semantics.policy", f"policy {own} goes with (and only with) loss_type {own}")
        if loss_type == own and not all(n in values for n in names) or loss_type != own and any(n in values for n in names):
            fail("$.parameters", f"{', '.join(names)} are declared with (and only with) loss_type {own}")
    if sem.get("policy", "clip") == "vespo" and sem["importance_sampling"] != "token":
        fail("$.semantics.importance_sampling", "vespo forms its own sequence weight: importance_sampling token")
    if sem["importance_sampling"] != values.get("importance_sampling_level", "token"):
        fail("$.semantics.importance_sampling", "must equal the importance_sampling_level parameter (token without it)")
    if sem["importance_sampling"] == "sequence" and "old_logprobs" not in inputs:
        fail("$.semantics.importance_sampling", "a sequence-level ratio needs old_logprobs (on-policy it equals token level)")
    need = requirements_for(doc.get("operation"))
    kl = terms["kl"]["present"]
    sources = [n for n in need.kl_sources if n in inputs]
    if kl != ("beta" in values) or kl != bool(sources):
        fail("$.terms.kl.present", f"a KL term needs the beta parameter and the {' or '.join(need.kl_sources)} input, "
             "and they need the term")
    if len(sources) > 1:
        fail("$.inputs", f"the KL term takes its reference from one input: {' or '.join(sources)}, not both")
    for dep in ("ref_hidden", "ref_bias"):
        if dep in inputs and "ref_weight" not in inputs:
            fail("$.inputs", f"{dep} is declared with ref_weight")
    if terms["mask"]["present"] != ("completion_mask" in inputs):
        fail("$.terms.mask.present", "must be true exactly when completion_mask is an input")
    correction = sem.get("correction", "none")
    vllm = correction != "none"
    if vllm != ("sampling_ratio" in inputs) or vllm != ("sampling_ratio_cap" in values):
        fail("$.semantics.correction", "a vllm correction goes with the sampling_ratio input and the sampling_ratio_cap parameter")
    mode = values.get("vllm_importance_sampling_mode", "token_truncate")
    if vllm and correction != ("vllm-truncate" if mode == "token_truncate" else "vllm-" + mode.replace("_", "-")):
        fail("$.semantics.correction", f"{correction!r} does not go with vllm_importance_sampling_mode {mode!r}")
    if values.get("use_bias_correction_kl") and not kl:
        fail("$.parameters", "use_bias_correction_kl needs the KL term")
    if "delta" in values and sem.get("policy", "clip") != "clip":
        fail("$.parameters", "delta applies to the clip policy only")
    if ("ref_logprobs" in inputs or "sampling_ratio" in inputs) and "old_logprobs" not in inputs:
        fail("$.inputs", "ref_logprobs and sampling_ratio are declared with old_logprobs")
    differentiable = [t["name"] for t in doc["inputs"] if t["differentiable"]]
    for protocol, spec in doc["traffic"].items():
        for side in ("read", "write"):
            for j, item in enumerate(spec[side]):
                name = item["tensor"].removeprefix("grad:")
                if name not in inputs:
                    fail(f"$.traffic.{protocol}.{side}[{j}].tensor", f"unknown tensor {item['tensor']!r}; inputs: {sorted(inputs)}")
                if item.get("rows") == "unmasked" and "completion_mask" not in inputs:
                    fail(f"$.traffic.{protocol}.{side}[{j}].rows", "rows 'unmasked' needs the completion_mask input")
        for name in differentiable if protocol != "forward" else ():
            if not any(i["tensor"] == "grad:" + name for i in spec["write"]):
                fail(f"$.traffic.{protocol}.write", f"a protocol with a backward writes grad:{name}")
    for name in doc["layouts"]:
        if name not in inputs:
            fail(f"$.layouts.{name}", f"unknown input {name!r}; inputs: {sorted(inputs)}")
    check_cases(doc, fail)


def check_cases(doc: dict[str, Any], fail: Fail) -> None:
    """Declared cases (grpo_conform.ops.grpo_logits.declared_cases) name declared parameters and valid values."""
    params = {p["name"]: p for p in doc["parameters"]}
    seen: set[str] = set()
    for i, case in enumerate(doc.get("cases", [])):
        where = f"$.cases[{i}]"
        if case["name"] in seen:
            fail(f"{where}.name", f"duplicate case name {case['name']!r}")
        seen.add(case["name"])
        named = list(case.get("values", {})) + list(case.get("equal", []))
        if "tie" in case:
            named.append(case["tie"]["parameter"])
        for name in named:
            if name not in params:
                fail(where, f"names parameter {name!r}, which this member does not declare ({sorted(params)})")
        for name, value in case.get("values", {}).items():
            if not _in_domain(value, params[name]["domain"]):
                fail(f"{where}.values.{name}", f"{value!r} is outside the parameter's domain {params[name]['domain']}")
        for name in case.get("equal", []) + ([case["tie"]["parameter"]] if "tie" in case else []):
            if params[name]["type"] != "float" or params[name].get("draw") is None:
                fail(where, f"parameter {name!r} is not a drawn float: an equality or a tie needs one")
