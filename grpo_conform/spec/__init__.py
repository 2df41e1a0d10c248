"""Semantics specs (docs/spec-family.md): JSON validated by a JSON Schema, loaded into frozen
pydantic models. Modules, each importing only those before it:

    model.py         the data model (`Spec`, `Parameter`, `Workload`, ...) and `SpecError`
    cross_checks.py  format-2 cross-references the schema cannot express (imports nothing here)
    documents.py     read + schema + cross-references + model = `Spec`; `spec_dirs`
    family.py        spec families: members resolved into format-2 documents
    find.py          `find_spec` (by reference) and `specs_for_manifest` (what a manifest claims)
    draws.py         parameter draws of the conformance calls

This package's namespace re-exports the public names, so `from grpo_conform.spec import Spec` is
the one way callers name them; modules inside the package import each other, never this file.
"""

from grpo_conform.spec.model import (  # noqa: F401
    DEFAULT_OPERATION, ENV_SPEC_DIRS, FAMILY_FORMAT, MEMBER_FORMAT, SPEC_SCHEMA_FILE, AdvantageDistribution, Avoid,
    Axis, Case, CaseTie, Constraints, Domain, Draw, ExactZero, FamilyRef, GradientSpec, GradientTolerance, KlTerm,
    LossTolerance, MaskTerm, MemberInputs, OutputSpec, Parameter, Poison, Profile, ResolvedWorkload, Semantics,
    SpanRange, Spec, SpecError, TensorSpec, Terms, Timing, Tolerance, TrafficItem, TrafficProtocol, Validation,
    ValueRange, Workload, operation_of,
)
from grpo_conform.spec.documents import (  # noqa: F401
    PACKAGED_SPECS, load_spec, read_document, spec_dirs, spec_from_document, validate_document,
)
from grpo_conform.spec.family import (  # noqa: F401
    Family, families, find_family, is_family_document, load_family, load_member, resolve_member_document,
)
from grpo_conform.spec.find import find_spec, specs_for_manifest  # noqa: F401
from grpo_conform.spec.draws import draw_parameters  # noqa: F401
