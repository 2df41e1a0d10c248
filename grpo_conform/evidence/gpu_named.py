"""Which GPU a record names: one answer for the floors `verify` recomputes and for the report's sections.

A record names its GPU in up to four fields. Before the adversarial round of 2026-12-05 the floor was
recomputed from one of them and the report's section came from another, so a record could name a GPU
the catalogue does not resolve in the first (no floor checked its time) and the real one in the second
(ranked among the real records), or use a look-alike letter (Cyrillic "Н200") to get a section that
reads like the real one. Now every name must be printable ASCII, every name that resolves must resolve
to the same catalogue entry, and a record of kind `cpu` may not name a catalogue GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

_FIELDS: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("hardware.catalogue.name", lambda hw: (hw.get("catalogue") or {}).get("name")),
    ("hardware.catalogue.id", lambda hw: (hw.get("catalogue") or {}).get("id")),
    ("hardware.device_name", lambda hw: hw.get("device_name")),
    ("hardware.device.name", lambda hw: (hw.get("device") or {}).get("name")),
)


@dataclass(frozen=True)
class NamedGpu:
    """The catalogue entry a record's names agree on (None: none resolves), and what contradicts itself."""

    gpu: Any  # hardware.GpuSpec or None
    kind: str | None  # hardware.device.kind as recorded
    problems: tuple[str, ...]


def names(hw: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, value) of every non-empty name the record gives its device."""
    return [(f, v) for f, get in _FIELDS if isinstance(v := get(hw), str) and v.strip()]


def text_problems(hw: dict[str, Any]) -> list[str]:
    """Names a reader could take for another GPU: anything but printable ASCII (look-alike letters,
    invisible or control characters). Cheap: no catalogue."""
    return [f"{field} {value!r} has characters outside printable ASCII (a look-alike of another name?)"
            for field, value in names(hw) if not (value.isascii() and value.isprintable())]


def resolve(hw: dict[str, Any]) -> NamedGpu:
    """The catalogue GPU the record names, with every contradiction among its names."""
    from grpo_conform.hardware import load_catalogue  # here: hardware imports torch (via timing)

    catalogue = load_catalogue()
    kind = (hw.get("device") or {}).get("kind")
    problems = text_problems(hw)
    found = {field: (value, catalogue.lookup(value)) for field, value in names(hw) if value.isascii()}
    matches = [m for _, m in found.values() if m is not None]
    # A torch name such as "NVIDIA A100 80GB" fits two variants; names agree when some entry fits them all.
    common = set.intersection(*(set(m.candidates) for m in matches)) if matches else set()
    gpu = None
    if matches and not common:
        listed = "; ".join(f"{f} {v!r} -> {'/'.join(m.candidates) if m else 'no entry'}" for f, (v, m) in found.items())
        problems.append(f"the record's names resolve to different GPUs of the catalogue ({listed})")
    elif matches:  # the most specific name's entry among those they all fit (the fastest on a tie)
        best = min(matches, key=lambda m: len(set(m.candidates) & common))
        gpu = best.gpu if best.gpu.id in common else max(
            (g for g in catalogue.gpus if g.id in common), key=lambda g: (g.dram_gbps, g.exp_per_s))
    if kind == "cpu" and matches:
        problems.append(f"hardware.device.kind is 'cpu' but the record names the GPU {matches[0].gpu.id}: a GPU run "
                        "relabelled as a CPU one would escape the GPU's floor")
    elif matches and kind != "cpu":
        unresolved = [f"{f} {v!r}" for f, (v, m) in found.items() if m is None]
        if unresolved:
            verb = "resolves" if len(unresolved) == 1 else "resolve"
            problems.append(f"{', '.join(unresolved)} {verb} to no catalogue GPU while the record's other names "
                            f"say {matches[0].gpu.id}: one device, several names")
    return NamedGpu(gpu, kind if isinstance(kind, str) else None, tuple(problems))
