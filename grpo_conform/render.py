"""Human-readable output: rich tables for check reports. JSON output is `to_json` + json.dumps."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from grpo_conform.check import CheckReport
from grpo_conform.spec import Spec

STYLE = {"pass": "green", "fail": "bold red", "error": "bold red", "timeout": "bold red", "skipped": "yellow"}
IMPL_STYLE = {"conformant": "bold green", "failed": "bold red", "skipped": "yellow", "load-error": "bold red"}


def _status(status: str, informational: bool = False) -> Text:
    label = "INFO" if informational and status == "pass" else status.upper()
    return Text(label, style="cyan" if label == "INFO" else STYLE.get(status, ""))


def render_check(report: CheckReport, console: Console) -> None:
    dev = report.device
    where = dev.get("name", dev["kind"])
    if report.interpreter:
        console.print(f"device: cpu ({where}); Triton kernels run under TRITON_INTERPRET=1 (no GPU)")
    else:
        console.print(f"device: {where}")
    for spec in report.specs.values():
        console.print(f"spec: {spec.id} {spec.version}  sha256 {spec.identity}")
    for impl in report.implementations:
        console.print()
        console.print(Text.assemble((f"{impl.name}", "bold"), f"  {impl.path}  sha256 {impl.identity[:16]}…  ",
                                    (impl.status.upper(), IMPL_STYLE[impl.status])))
        if impl.status in ("skipped", "load-error") or not impl.workloads:
            console.print(Text(f"  {impl.message}"))
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
                table.add_row(Text(label), o.check, _status(o.status, o.informational), Text(o.message))
            for t in w.timings:
                table.add_row("", f"time {t.get('protocol')}", Text("TIME", style="cyan"), Text(t.get("summary", "")))
            table.add_section()
        console.print(table)
    console.print()
    console.print(f"exit code {report.exit_code}")


def render_spec(spec: Spec, console: Console) -> None:
    console.print(f"id:       {spec.id}")
    console.print(f"version:  {spec.version}")
    console.print(f"identity: sha256 {spec.identity}")
    console.print(f"file:     {spec.source}", markup=False)
    for line in spec.summary_lines():
        console.print(line, highlight=False, markup=False)
