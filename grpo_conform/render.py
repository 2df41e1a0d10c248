"""Human-readable output: rich tables for check reports. JSON output is `to_json` + json.dumps."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from grpo_conform.gate.progress import not_run_label
from grpo_conform.report.failures import failing, failure_lines
from grpo_conform.report.spec_text import spec_text
from grpo_conform.results import INTERNAL_ERROR, CheckReport, internal_error, not_judged
from grpo_conform.spec import Spec

STYLE = {"pass": "green", "fail": "bold red", "error": "bold red", "timeout": "bold red", "skipped": "yellow"}
IMPL_STYLE = {"conformant": "bold green", "failed": "bold red", "skipped": "yellow", "load-error": "bold red"}


def _status(status: str, informational: bool = False, set_aside: bool = False) -> Text:
    if set_aside:  # see results.attribute_root_cause: the root cause is shown on its own row
        return Text("NOT JUDGED", style="dim")
    label = "INFO" if informational and status == "pass" else status.upper()
    return Text(label, style="cyan" if label == "INFO" else STYLE.get(status, ""))


def render_check(report: CheckReport, console: Console) -> None:
    dev = report.device
    where = dev.get("name", dev["kind"])
    if report.interpreter:  # header lines stay whole at any width (soft_wrap): identities are copied from them
        console.print(f"device: cpu ({where}); Triton kernels run under TRITON_INTERPRET=1 (no GPU)", soft_wrap=True)
    else:
        console.print(f"device: {where}", soft_wrap=True)
    for spec in report.specs.values():
        console.print(f"spec: {spec.id} {spec.version}  sha256 {spec.identity}", soft_wrap=True, highlight=False)
    for impl in report.implementations:
        console.print()
        verdict = impl.status.upper()
        if impl.status == "conformant" and any(m.coverage.checks for m in impl.members or ()):
            verdict = "PARTIAL: conformant on the checks -k selected, not a full verdict"  # never CONFORMANT
        console.print(Text.assemble((f"{impl.name}", "bold"), f"  {impl.path}  sha256 {impl.identity[:16]}…  ",
                                    (verdict, IMPL_STYLE[impl.status])), soft_wrap=True)
        box = (impl.worker or {}).get("sandbox") or {}
        if box.get("kind") == "bwrap":  # --sandbox bwrap: say so where the verdict is read
            user = ((impl.worker or {}).get("user") or {}).get("user", "?")
            console.print(Text(f"  sandbox: bwrap ({box.get('version', '?')}): no network, read-only file system but "
                               f"its scratch directory; worker user {user}"), soft_wrap=True)
        broke = any(internal_error(w) for w in impl.workloads)  # grpo-conform raised: show what was judged
        if impl.status in ("skipped", "load-error") or not impl.workloads:
            console.print(Text(f"  {impl.message}"), soft_wrap=True)  # one line, whatever its length
            if not broke:
                continue
        table = Table(show_header=True, header_style="bold", expand=False, pad_edge=False)
        table.add_column("workload", no_wrap=True)
        table.add_column("check", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("reason / evidence", overflow="fold")
        for w in impl.workloads:
            shape = "x".join(str(w.axes[a]) for a in ("batch", "seq_next", "vocab") if a in w.axes)
            for i, o in enumerate(w.outcomes):
                label = f"{w.workload} [{shape}]" if i == 0 else ""
                status = (Text("INTERNAL ERROR", style="bold magenta") if INTERNAL_ERROR in o.evidence else
                          _status(o.status, o.informational, not_judged(o)))
                table.add_row(Text(label), o.check, status, Text(o.message))
            for t in w.timings:
                table.add_row("", f"time {t.get('protocol')}", Text("TIME", style="cyan"), Text(t.get("summary", "")))
            table.add_section()
        console.print(table)
        for line in coverage_lines(impl):
            console.print(Text(line, style="dim"), soft_wrap=True, highlight=False)
        for line in not_run_lines(impl):
            console.print(Text(line, style="dim"), soft_wrap=True, highlight=False)
    for impl in failing(report.implementations):  # the root cause, whole, where the eye lands last
        console.print()
        for i, line in enumerate(failure_lines(impl)):
            console.print(Text(line, style="bold red" if i == 0 else ""), soft_wrap=True, highlight=False)
    console.print()
    console.print(f"exit code {report.exit_code}")


def coverage_lines(impl) -> list[str]:
    """Per member, what its calls exercised (the record's coverage.exercised): named cases listed,
    long categories (defaults, boundaries, dtypes, shapes) counted."""
    # here, not at the top: the operations package imports torch, which `spec show` never needs
    from grpo_conform.ops.grpo_logits.declared_cases import merge_exercised, workload_exercised

    out = []
    for m in getattr(impl, "members", ()) or ():
        got = merge_exercised(*(workload_exercised(w.draws, w.dtypes, w.axes) for w in m.workloads))
        if not got:
            continue
        parts = [f"{k} {len(v)}" if k in ("defaults", "boundaries", "dtypes", "shapes") else f"{k} [{', '.join(v)}]"
                 for k, v in got.items()]
        out.append(f"  exercised {m.spec.member or m.spec.id}: " + "; ".join(parts))
    return out


def not_run_lines(impl) -> list[str]:
    """Per member, every workload that did not run, grouped by why (the summary line counts the same
    labels: gate.progress.not_run_label), so the table, the summary and --strict tell one story."""
    out = []
    for m in getattr(impl, "members", ()) or ():
        groups: dict[tuple[str, str], list[str]] = {}
        for n in m.coverage.not_run:
            groups.setdefault((not_run_label(n), n.reason), []).append(n.workload)
        if groups:
            said = "; ".join(f"{reason}: {', '.join(names)}" if reason.startswith(label) else
                             f"{label}: {', '.join(names)} ({reason})" for (label, reason), names in groups.items())
            out.append(f"  not run {m.spec.member or m.spec.id}: {said}")
    return out


def render_spec(spec: Spec, console: Console, brief: bool = False) -> None:
    """Formula, inputs, outputs, parameters, constraints (then tolerances, traffic, workloads unless brief)."""
    for line in spec_text(spec, brief):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def render_bench(report, console: Console) -> None:
    hw = report.hardware or {}
    console.print(f"device: {report.device.get('name')}  (spec {report.spec['id']} {report.spec['version']})",
                  markup=False)
    measured = hw.get("ceilings") or {}
    if measured:
        console.print(Text(f"measured ceilings: {json_summary(measured)}"))
    table = Table(show_header=True, header_style="bold")
    for col in ("implementation", "workload", "protocol", "median ms", "p10-p90 ms", "x floor (datasheet)",
                "x floor (measured)", "x first", "status"):
        table.add_column(col, no_wrap=True)
    for r in report.rows:
        t = r.timing
        if t is None:
            table.add_row(r.implementation, r.workload, r.protocol, "", "", "", "", "",
                          Text(f"{r.status.upper()}: {r.message}", style=STYLE.get("fail" if r.status != "skipped"
                                                                                   else "skipped")))
            continue
        e = t["event"]
        ratio = lambda key: f"{t[key]:.2f}" if isinstance(t.get(key), float) else ""  # noqa: E731
        table.add_row(r.implementation, r.workload, r.protocol, f"{e['median_ns'] / 1e6:.4f}",
                      f"{e['p10_ns'] / 1e6:.4f}-{e['p90_ns'] / 1e6:.4f}", ratio("floor_ratio"),
                      ratio("measured_floor_ratio"), f"{r.ratio_to_first:.2f}" if r.ratio_to_first else "",
                      Text(r.status.upper() + (f" ({', '.join(r.failed_checks)})" if r.failed_checks else ""),
                           style="green" if r.status == "measured" else "bold red"))
    console.print(table)
    for r in report.rows:
        for w in (r.timing or {}).get("warnings", []):
            console.print(Text(f"warning: {r.implementation} {r.workload} {r.protocol}: {w}", style="yellow"))


def json_summary(measured: dict) -> str:
    parts = []
    for key, label in (("copy_bytes_per_s", "copy"), ("read_bytes_per_s", "read")):
        if isinstance(measured.get(key), (int, float)):
            parts.append(f"{label} {measured[key] / 1e12:.2f} TB/s")
    return ", ".join(parts) or "n/a"


def render_verify(report, console: Console) -> None:
    for f in report.files:
        head = Text.assemble((f"{'OK  ' if f.ok else 'FAIL'} ", "bold green" if f.ok else "bold red"), f.path)
        if f.unsigned:
            head.append("  (UNSIGNED, accepted by --allow-unsigned)" if f.ok else "  (UNSIGNED)", style="yellow")
        console.print(head)
        for step in f.steps:
            style = {"pass": "green", "fail": "bold red", "skipped": "yellow"}.get(step.status, "yellow")
            console.print(Text.assemble("    ", (f"{step.step:<11}", "bold"), (f"{step.status:<18}", style),
                                        step.message))
            for note in step.notes:
                console.print(Text(f"                                 {note}"))
    console.print(f"exit code {report.exit_code}")
