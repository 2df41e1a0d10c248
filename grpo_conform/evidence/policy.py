"""What the user expects of a record: `verify --policy FILE` and the flags for the common cases.

A signature says who vouches for a record; a policy says whether the record is the one you
wanted: the artifact (subject path or digest), the outcome (result, full coverage), the spec (id,
version range), who may sign for which implementation, the hardware and how old it may be.
The policy file is JSON or TOML (by its suffix) with the fields of `Policy`; unknown fields are
refused so a typo cannot silently loosen a rule.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from grpo_conform.errors import GrpoConformError
from grpo_conform.evidence.keys import parse_time
from grpo_conform.gate.selection import partial_reason

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_AGE = re.compile(r"^(\d+)([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_COMPARATOR = re.compile(r"^(>=|<=|==|!=|>|<)?\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?$")  # "<2" is "<2.0.0"


class PolicyError(GrpoConformError):
    """A policy file or flag that cannot be read; says which field and what was expected."""


def parse_age(text: str) -> int:
    m = _AGE.match(text.strip())
    if not m:
        raise ValueError(f"{text!r}: expected a duration such as 3600, 90m, 12h, 30d or 2w")
    return int(m[1]) * _UNITS[m[2]]


def _parse_range(spec_range: str) -> list[tuple[str, tuple[int, int, int]]]:
    """Every comparator of a range, parsed whole: a bad part is an error even after one that fails."""
    out = []
    for part in spec_range.split(","):
        m = _COMPARATOR.match(part.strip())
        if not m:
            raise ValueError(f"{part!r}: expected comparators such as '>=1.0.0,<2.0.0' (or '>=1,<2')")
        out.append((m[1] or "==", tuple(int(x or 0) for x in m.group(2, 3, 4))))
    return out


def _version_ok(version: str, spec_range: str) -> bool:
    have = tuple(int(x) for x in version.split("."))
    ops = {">=": tuple.__ge__, "<=": tuple.__le__, "==": tuple.__eq__, "!=": tuple.__ne__, ">": tuple.__gt__,
           "<": tuple.__lt__}
    return all(ops[op](have, want) for op, want in _parse_range(spec_range))


class Policy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    subject_path: Optional[str] = None  # e.g. "implementations/triton"
    subject_digest: Optional[str] = None  # the implementation identity (dirHash) you expect
    require_result: tuple[str, ...] = ()  # e.g. ("PASSED",) or ("PASSED", "WARNED")
    require_verdict: tuple[str, ...] = ()  # e.g. ("conformant",)
    require_full_coverage: bool = False  # every workload of the member, no check selection, no member left out,
    # nothing left out by -k/--workload/--member/--shard (the record's `selection`, issue 28)
    # "CATEGORY:CASE" the record's coverage.exercised must list ("ties:tie at delta"; CASE "*": any)
    require_exercised: tuple[str, ...] = ()
    require_declared_cases: bool = False  # every case coverage.declared names was exercised
    spec_id: Optional[str] = None
    spec_version: Optional[str] = None  # a range: ">=1.0.0,<2.0.0"
    signers: dict[str, tuple[str, ...]] = {}  # implementation name (or "*") -> allowed key ids or owners
    hardware: Optional[str] = None  # case-insensitive substring of the recorded device name
    max_age: Optional[str] = None  # "30d": run.finished no older than this at verification time
    builder: Optional[str] = None  # prefix of run.builder.id (v2 records)

    @field_validator("require_result")
    @classmethod
    def _results(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [r for r in v if r not in ("PASSED", "WARNED", "FAILED")]
        if bad:
            raise ValueError(f"{bad}: expected PASSED, WARNED or FAILED")
        return v

    @field_validator("require_exercised")
    @classmethod
    def _exercised(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [r for r in v if ":" not in r or not r.split(":", 1)[0] or not r.split(":", 1)[1]]
        if bad:
            raise ValueError(f"{bad}: expected CATEGORY:CASE, e.g. 'ties:tie at delta' or 'dtypes:*'")
        return v

    @field_validator("max_age")
    @classmethod
    def _age(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            parse_age(v)
        return v

    @field_validator("spec_version")
    @classmethod
    def _range(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            _parse_range(v)
        return v

    @property
    def requires_pass(self) -> bool:
        return bool(self.require_result) and "FAILED" not in self.require_result

    def is_empty(self) -> bool:
        return self == Policy()

    def merged(self, **flags: Any) -> "Policy":
        """This policy with the given flags (non-empty ones) taking precedence."""
        data = self.model_dump()
        for k, v in flags.items():
            if v not in (None, (), {}, False):
                data[k] = v
        try:
            return Policy.model_validate(data)
        except ValidationError as exc:
            raise PolicyError(_first(exc, "flags")) from None


def _first(exc: ValidationError, where: str) -> str:
    e = exc.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
    return f"{where}: {loc}: {e['msg']}"


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the policy: {exc.strerror}") from None
    try:
        doc = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}") from None
    try:
        return Policy.model_validate(doc)
    except ValidationError as exc:
        raise PolicyError(_first(exc, str(path))) from None


def policy_problems(policy: Policy, statement: dict[str, Any], signers: tuple[dict[str, str], ...],
                    now: datetime) -> list[str]:
    """Every rule of `policy` the (verified, consistent) statement breaks."""
    p = statement["predicate"]
    subject = statement["subject"][0]
    digest = next(iter(subject["digest"].values()))
    out = []
    if policy.subject_path is not None and subject["name"] != policy.subject_path.rstrip("/"):
        out.append(f"subject is {subject['name']!r}, the policy expects {policy.subject_path!r}")
    if policy.subject_digest is not None and digest != policy.subject_digest.lower():
        out.append(f"subject digest {digest[:16]}… is not the expected {policy.subject_digest[:16]}…")
    if policy.require_result and p["result"] not in policy.require_result:
        out.append(f"result {p['result']}, the policy requires {' or '.join(policy.require_result)}")
    if policy.require_verdict and p["verdict"] not in policy.require_verdict:
        out.append(f"verdict {p['verdict']}, the policy requires {' or '.join(policy.require_verdict)}")
    cov = p.get("coverage")
    if policy.require_full_coverage:  # every workload, every check, every member (grpo_conform/gate/selection.py)
        reason = partial_reason(p)
        if cov is None:
            out.append("the record does not say what it covers (a v1 record); the policy requires full coverage")
        elif reason:
            out.append(f"{reason}; the policy requires full coverage")
    out += _exercised_problems(policy, cov)
    if policy.spec_id is not None and p["spec"]["id"] != policy.spec_id:
        out.append(f"spec {p['spec']['id']}, the policy expects {policy.spec_id}")
    if policy.spec_version is not None and not _version_ok(p["spec"]["version"], policy.spec_version):
        out.append(f"spec version {p['spec']['version']} is outside {policy.spec_version}")
    allowed = policy.signers.get(p["implementation"]["name"], policy.signers.get("*"))
    if allowed is not None:
        ok = [s for s in signers if s["keyid"] in allowed or s["owner"] in allowed]
        if not ok:
            who = ", ".join(f"{s['owner']} ({s['keyid'][:16]}…)" for s in signers) or "nobody"
            out.append(f"signed by {who}; the policy allows only {list(allowed)} for {p['implementation']['name']}")
    if policy.hardware is not None:
        name = str(p["hardware"].get("device", {}).get("name", ""))
        if policy.hardware.lower() not in name.lower():
            out.append(f"hardware {name!r} (self-reported), the policy expects {policy.hardware!r}")
    if policy.max_age is not None:
        age = (now - parse_time(p["run"]["finished"])).total_seconds()
        if age > parse_age(policy.max_age):
            out.append(f"finished {p['run']['finished']}, older than {policy.max_age}")
    if policy.builder is not None:
        builder = p["run"].get("builder", {}).get("id", "")
        if not str(builder).startswith(policy.builder):
            out.append(f"builder {builder or '(none recorded)'!r} does not start with {policy.builder!r}")
    return out


def _exercised_problems(policy: Policy, cov: dict[str, Any] | None) -> list[str]:
    """--require-exercised / --require-declared-cases against coverage.exercised (issue 27 item 6)."""
    if not policy.require_exercised and not policy.require_declared_cases:
        return []
    exercised = (cov or {}).get("exercised")
    if exercised is None:
        return ["the record does not list what its calls exercised (coverage.exercised: a record older than "
                "issue 27); the policy requires it"]
    missing = []
    for rule in policy.require_exercised:
        category, case = rule.split(":", 1)
        names = exercised.get(category, [])
        if not names if case == "*" else case not in names:
            missing.append(rule)
    if policy.require_declared_cases:
        for category, names in (cov.get("declared") or {}).items():
            missing += [f"{category}:{n}" for n in names if n not in exercised.get(category, [])]
    if not missing:
        return []
    return [f"not exercised: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}; the policy requires "
            f"{'them' if len(missing) > 1 else 'it'}"]
