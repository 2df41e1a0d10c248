"""The command line. Each command parses its options into a request object and hands it to the
library; only this module prints and exits. A `GrpoConformError` becomes its message on stderr
and its exit code (2 usage/spec/manifest, 3 environment); anything else is a bug.

Each command imports the library modules it uses inside its own function: `grpo-conform --help` and
the light commands (`spec`, `verify`, `report`) must not pay for torch and the engine at start-up."""

from __future__ import annotations

import datetime
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.text import Text

from grpo_conform import __version__
from grpo_conform.errors import EXIT_OK, EXIT_USAGE, GrpoConformError
from grpo_conform.protocol_names import PROTOCOLS  # not floors: that imports torch

# Tables fit the screen at a terminal (issue 35: they were a fixed 200 columns) and follow $COLUMNS where
# it is set; a log or a pipe with neither keeps 200 columns, so long evidence lines stay whole there.
out = Console(soft_wrap=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
err = Console(stderr=True, soft_wrap=True)  # an error stays one line, also when stderr is not a terminal


class JobsType(click.ParamType):
    """`--jobs`: a count of 1 or more, or `auto` (0 in the request: resolved by the plan, gate/parallel.py)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif str(value).strip().lower() == "auto":
            return 0
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r}: expected a whole number of slots (1 or more) or auto", param, ctx)
        if number < 1:
            self.fail(f"{number}: expected 1 or more slots, or auto", param, ctx)
        return number


def _fail_cleanly(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GrpoConformError as exc:
            err.print(Text.assemble(("error: ", "bold red"), str(exc)), highlight=False)
            sys.exit(exc.exit_code)

    return wrapper


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="grpo-conform")
def main() -> None:
    """Check GRPO loss kernels against a machine-readable spec, time them honestly, and sign the evidence."""


# -- spec ---------------------------------------------------------------------------------------
@main.group()
def spec() -> None:
    """Inspect and validate semantics specs."""


@spec.command("show")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--member", help="a member of a spec family file (its resolved spec)")
@click.option("--resolved", is_flag=True, help="print the resolved JSON document whose RFC 8785 sha256 is the identity")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def spec_show(file: str, member: str | None, resolved: bool, fmt: str) -> None:
    """Print a spec's id, version, sha256 identity and a readable summary (a family: its members)."""
    # start-up: see the module docstring
    from grpo_conform.render import render_spec
    from grpo_conform.spec import is_family_document, load_family, load_spec, read_document

    doc = read_document(file)
    if is_family_document(doc):
        fam = load_family(file)
        if member is None:
            if resolved:
                raise click.UsageError("--resolved needs --member NAME for a family file")
            members = [(name, fam.member(name).identity) for name in fam.member_names]
            if fmt == "json":
                _emit_json({"family": fam.id, "version": fam.version, "path": str(fam.path),
                            "members": [{"member": n, "id": f"{fam.id}/{n}", "identity": {"sha256": i}} for n, i in members]})
                return
            out.print(f"family:   {fam.id} {fam.version}", highlight=False)
            out.print(f"file:     {fam.path}", markup=False, highlight=False)
            out.print(f"members:  {', '.join(n for n, _ in members)} (all of one: --member NAME)", highlight=False,
                      soft_wrap=True)
            for n, _i in members:  # formula, inputs, outputs, parameters, constraints of each member
                out.print()
                render_spec(fam.member(n), out, brief=True)
            return
        loaded, document = fam.member(member), fam.resolved(member)
    else:
        if member is not None:
            raise click.UsageError(f"{file} is a standalone spec: it has no members (drop --member)")
        loaded, document = load_spec(file), doc
    if resolved:
        out.print(json.dumps(document, indent=2, ensure_ascii=False), markup=False, highlight=False, soft_wrap=True)
    elif fmt == "json":
        _emit_json({"id": loaded.id, "version": loaded.version, "member": loaded.member,
                    "identity": {"sha256": loaded.identity}, "path": loaded.source, "summary": loaded.summary_lines()})
    else:
        render_spec(loaded, out)


@spec.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_fail_cleanly
def spec_validate(files: tuple[str, ...]) -> None:
    """Validate spec files (standalone or family: every member resolved) against the schema and their cross-references."""
    # start-up: see the module docstring
    from grpo_conform.spec import is_family_document, load_family, load_spec, read_document

    # start-up: see the module docstring
    from grpo_conform.report.spec_text import validate_problems

    problems = {f: validate_problems(f) for f in files}  # every file, every schema error (not the first)
    for file, found in problems.items():
        if found:
            out.print(f"{file}: INVALID ({len(found)} problem(s))", highlight=False, markup=False)
            for p in found:
                out.print(f"  {p}", highlight=False, markup=False, soft_wrap=True)
    if any(problems.values()):
        sys.exit(EXIT_USAGE)
    for file in files:
        if is_family_document(read_document(file)):
            fam = load_family(file)
            specs = fam.members()
            out.print(f"{file}: valid (family {fam.id} {fam.version}, {len(specs)} members)", highlight=False, soft_wrap=True)
            for loaded in specs:
                out.print(f"  {loaded.id}: sha256 {loaded.identity}", highlight=False, soft_wrap=True)
            continue
        loaded = load_spec(file)
        out.print(f"{file}: valid ({loaded.id} {loaded.version}, sha256 {loaded.identity})", highlight=False, soft_wrap=True)


# -- check --------------------------------------------------------------------------------------
@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto = cuda when available")
@click.option("--workload", "workloads", multiple=True, help="run only this workload of the spec (repeatable)")
@click.option("--member", "members", multiple=True, help="run only this spec member (name or id; repeatable)")
@click.option("--extended", is_flag=True, help="also the spec's extended workloads (more CPU shapes and dtypes)")
@click.option("-k", "--check", "checks", multiple=True,
              help="report only this check (name or pattern, e.g. 'gradient*'; repeatable); `runs` is always reported")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), help="spec file or id (a family id such as grpo-fused-linear, a member id such as grpo-fused-linear/token-is; default: the manifest's spec)")
@click.option("--timeout", type=float, help="seconds one worker step may take (default: scaled by the workload)")
@click.option("--no-timing", is_flag=True, help="skip the timed protocols on CUDA")
@click.option("--sandbox", type=click.Choice(["none", "bwrap"]), default="none", show_default=True,
              help="bwrap: run each worker inside bubblewrap (no network, read-only file system but its scratch "
                   "directory); bwrap from $GRPO_CONFORM_BWRAP, /usr/bin/bwrap or PATH; exit 2 if it cannot start")
@click.option("-x", "--fail-fast", is_flag=True, help="stop at the first failure: no probe runs after the one that failed a check (of -k's where given), no workload after it (the rest: not run)")
@click.option("--explore", type=click.IntRange(min=0), default=0, metavar="N",
              help="after the workloads, N property-based cases per member over its declared domain (shapes, "
                   "dtypes, parameters, advantages); a failure is shrunk and printed as a runnable snippet")
@click.option("--strict", is_flag=True, help="a skipped implementation or workload fails the run (exit 1)")
@click.option("--changed-since", metavar="REF",
              help="only the implementation folders changed since this git ref (all when the validator, a spec "
                   "or a lock file changed)")
@click.option("--shard", metavar="I/N", help="run part I of N of the work (deterministic); merge with `merge`")
@click.option("--deadline", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="start no workload after this many seconds; the rest is reported as not run (stopped) and "
                   "the records hold what completed (for a run under an outer time limit)")
@click.option("--jobs", "-j", type=JobsType(), default="auto", show_default=True, envvar="GRPO_CONFORM_JOBS",
              show_envvar=True,
              help="slot processes run in parallel (per GPU with --gpus; slots on one GPU share it, each timing "
                   "with the GPU to itself); auto: one per usable CPU core on the CPU (at most one per member, at "
                   "most 4), on CUDA one per 3 cores, at most 4 per GPU")
@click.option("--gpus", metavar="all|0,1", help="pin slots to these GPUs (CUDA_VISIBLE_DEVICES per slot)")
@click.option("--junit-xml", type=click.Path(dir_okay=False), help="write a JUnit XML report here")
@click.option("--summary", "summary_file", type=click.Path(dir_okay=False),
              help="write a Markdown summary here (e.g. \"$GITHUB_STEP_SUMMARY\", appended to)")
@click.option("--evidence-dir", default="grpo-conform-evidence", show_default=True, type=click.Path(file_okay=False),
              help="where the evidence records (DSSE envelopes) are written")
@click.option("--no-evidence", is_flag=True, help="write no evidence record")
@click.option("--key", "key_path", type=click.Path(dir_okay=False),
              help="Ed25519 private key (PEM) to sign records; else $GRPO_CONFORM_SIGNING_KEY (PEM) or "
                   "$GRPO_CONFORM_SIGNING_KEY_FILE (path); none: records are written unsigned")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--profile-phases", is_flag=True, help="print where the run's wall time went (worker, judging, "
              "inputs, probes, workloads) on stderr; the JSON report always has it under `phases`")
@_fail_cleanly
def check(paths: tuple[str, ...], device: str, workloads: tuple[str, ...], members: tuple[str, ...],
          extended: bool, checks: tuple[str, ...], spec_path: str | None, timeout: float | None, no_timing: bool,
          sandbox: str, fail_fast: bool, explore: int,
          strict: bool, changed_since: str | None, shard: str | None, deadline: float | None, jobs: int,
          gpus: str | None, junit_xml: str | None, summary_file: str | None, evidence_dir: str, no_evidence: bool,
          key_path: str | None, fmt: str, profile_phases: bool = False) -> None:
    """Check implementation folders against their spec.

    Exit 0 conformant, 1 failed (or skipped, with --strict), 2 usage/manifest/load error, 3 nothing
    could run here (environment) or an internal error of grpo-conform on a workload, 130 interrupted
    (SIGINT), 143 terminated (SIGTERM)."""
    # start-up: see the module docstring
    from grpo_conform.check import CheckRequest, run_check
    from grpo_conform.evidence import load_signing_key
    from grpo_conform.gate.parallel import parse_gpus
    from grpo_conform.gate.shard import parse_shard

    # start-up: see the module docstring
    from grpo_conform.provenance import check_environment

    key = None if no_evidence else load_signing_key(key_path)  # a bad key fails before anything runs
    if not no_evidence:
        check_environment()  # so does a commit a record could not carry
    request = CheckRequest(paths=paths, device=device, workloads=workloads, spec_path=spec_path, timeout=timeout,
                           timing=not no_timing, members=members, checks=checks, fail_fast=fail_fast, strict=strict,
                           changed_since=changed_since, shard=parse_shard(shard) if shard else None, jobs=jobs,
                           gpus=parse_gpus(gpus) if gpus else None, extended=extended, sandbox=sandbox,
                           deadline=deadline, explore=explore)
    report = _interruptible(lambda progress: run_check(request, progress=progress), "checking…")
    if profile_phases:
        from grpo_conform.phases import render  # only with --profile-phases: the CLI imports per command

        err.print(render(report.phases), highlight=False, markup=False)
    _finish(report, fmt, junit_xml, summary_file, evidence=None if no_evidence else (evidence_dir, key))


def _explore_snippets(report: Any) -> list[str]:
    return [w.draws["explore"]["snippet"] for impl in report.implementations for w in impl.workloads
            if w.workload == "explore" and (w.draws.get("explore") or {}).get("snippet")]


def _interruptible(run: Callable[[Callable[[str], None]], Any], label: str) -> Any:
    """Run with progress lines (a spinner on a terminal); Ctrl-C exits 130, SIGTERM 143, both after
    the run's `finally` blocks closed every worker and removed its files."""

    # start-up: see the module docstring
    from grpo_conform.gate.signals import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, install_handlers

    install_handlers()
    started = time.monotonic()
    try:
        if err.is_terminal:
            with err.status(label) as status:
                return run(lambda msg: status.update(msg))
        return run(lambda msg: err.print(msg, highlight=False, markup=False, soft_wrap=True))
    except KeyboardInterrupt:
        _end_workers()
        err.print(f"interrupted after {time.monotonic() - started:.1f} s: workers stopped, temporary files removed "
                  f"(exit {EXIT_INTERRUPTED})", highlight=False)
        sys.exit(EXIT_INTERRUPTED)
    except Terminated:
        _end_workers()
        err.print(f"terminated (SIGTERM) after {time.monotonic() - started:.1f} s: workers stopped, temporary files "
                  f"removed (exit {EXIT_TERMINATED})", highlight=False)
        sys.exit(EXIT_TERMINATED)


def _end_workers() -> None:
    """Belt and braces after the run's `finally` blocks: every live worker session (and any process
    that escaped one and came back to our subreaper) ended, every scratch tree removed."""
    try:
        # start-up: see the module docstring
        from grpo_conform.isolation.session import end_all
    except ImportError:  # pragma: no cover - an isolation layer without the registry
        return
    end_all()


def _finish(report: Any, fmt: str, junit_xml: str | None, summary_file: str | None, evidence=None) -> None:
    # start-up: see the module docstring
    from grpo_conform.gate.junit import write_junit
    from grpo_conform.gate.progress import summary_line
    from grpo_conform.gate.summary import write_summary
    from grpo_conform.render import render_check

    records: tuple = ()
    if evidence is not None:
        # start-up: see the module docstring
        from grpo_conform.evidence import write_evidence

        records = write_evidence(report, *evidence)  # --jobs/--gpus: one record per slot report and member
    if junit_xml:
        write_junit(report, junit_xml)
    if summary_file:
        write_summary(report, summary_file)
    if fmt == "json":
        _emit_json(dict(report.to_json(), evidence_records=[r.to_json() for r in records]))
    else:
        render_check(report, out)
    for r in records:
        if r.signed:
            err.print(f"evidence: {r.path} (signed, key {r.keyids[0][:16]}…)", highlight=False)
        else:
            err.print(Text.assemble(("evidence: ", ""), (f"{r.path} is UNSIGNED", "bold yellow"),
                                    " (no --key, $GRPO_CONFORM_SIGNING_KEY or $GRPO_CONFORM_SIGNING_KEY_FILE); "
                                    "`grpo-conform verify` rejects it unless --allow-unsigned"), highlight=False)
    for snippet in _explore_snippets(report):  # --explore: each minimal failing case, ready to run
        err.print(snippet, highlight=False, markup=False, soft_wrap=True)
    for note in report.notes:
        err.print(f"note: {note}", highlight=False, markup=False)
    for where in report.internal_errors:  # grpo-conform's own bug on a workload (checks/internal.py): exit 3
        err.print(Text.assemble(("internal error of grpo-conform: ", "bold red"), where, "; not a finding about the "
                                "implementation: please report it with this output (the record's "
                                "draws.internal_error holds the traceback)"), highlight=False)
    if report.strict and report.strict_failures:
        err.print(f"--strict: {len(report.strict_failures)} skipped or not run, failing the run: "
                  + "; ".join(report.strict_failures[:5]), highlight=False, markup=False)
    err.print(summary_line(report), highlight=False, markup=False)
    sys.exit(report.exit_code)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--strict", is_flag=True, help="a skipped implementation or workload not run fails the merge")
@click.option("--junit-xml", type=click.Path(dir_okay=False), help="write a JUnit XML report here")
@click.option("--summary", "summary_file", type=click.Path(dir_okay=False), help="write a Markdown summary here")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--trusted-keys", type=click.Path(dir_okay=False), help="verify records against this trusted-keys "
              "list instead of the shipped trust root (named as an override)")
@click.option("--project", type=click.Path(file_okay=False), help="the checkout records' identities are "
              "recomputed from (default: the current directory's)")
@_fail_cleanly
def merge(files: tuple[str, ...], strict: bool, junit_xml: str | None, summary_file: str | None, fmt: str,
          trusted_keys: str | None = None, project: str | None = None) -> None:
    """Merge shard outputs (JSON reports of `check --format json`, evidence records, or folders of them) into one
    verdict per implementation; refuses duplicates and conflicts. Exit codes as `check`."""
    # start-up: see the module docstring
    from grpo_conform.gate.merge import MergeRequest, run_merge

    _finish(run_merge(MergeRequest(files=files, strict=strict, trusted_keys=trusted_keys, project=project)), fmt,
            junit_xml, summary_file)


# -- manifests ----------------------------------------------------------------------------------
@main.group()
def manifest() -> None:
    """Validate implementation manifests."""


@manifest.command("validate")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@_fail_cleanly
def manifest_validate(paths: tuple[str, ...]) -> None:
    """Validate implementation folders (or their implementation.toml): manifest fields, entry file, spec and
    members resolvable. Used by the pre-commit hook."""
    # start-up: see the module docstring
    from grpo_conform.gate.validate import ValidateRequest, run_validate

    report = run_validate(ValidateRequest(paths=paths))
    for line in report.lines:
        out.print(line, highlight=False, markup=False, soft_wrap=True)  # one line each, any width
    sys.exit(report.exit_code)


@main.command("init")
@click.argument("member")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--name", help="the implementation's name (default: the folder's name)")
@click.option("--force", is_flag=True, help="overwrite implementation.toml and impl.py if they exist")
@_fail_cleanly
def init(member: str, folder: str, name: str | None, force: bool) -> None:
    """Write FOLDER/implementation.toml and a commented, conformant eager PyTorch impl.py for MEMBER
    of the grpo family (e.g. token-offpolicy-mask), to start an implementation from."""
    # start-up: see the module docstring
    from grpo_conform.scaffold import InitRequest, run_init

    result = run_init(InitRequest(member=member, folder=Path(folder), name=name, force=force))
    for f in result.files:
        click.echo(f"wrote {f}")
    click.echo(f"next: grpo-conform check {folder} --device cpu")


# -- timing and floors --------------------------------------------------------------------------
@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--protocol", "protocols", multiple=True, type=click.Choice(list(PROTOCOLS)),
              help="protocol to time (repeatable; default full, the headline: forward + backward)")
@click.option("--workload", "workloads", multiple=True, help="workload of the spec (default: its timed workloads)")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False))
@click.option("--reps", type=int, default=20, show_default=True, help="timed calls per protocol")
@click.option("--warmup", type=int, default=3, show_default=True, help="warmup calls per protocol (excluded)")
@click.option("--timeout", type=float)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def bench(paths, protocols, workloads, spec_path, reps, warmup, timeout, fmt) -> None:
    """Time implementations on a GPU: median, quantiles, floor ratios, ratio to the first one named."""
    # start-up: see the module docstring
    from grpo_conform.bench import BenchRequest, run_bench
    from grpo_conform.render import render_bench

    request = BenchRequest(paths=paths, protocols=protocols or ("full",), workloads=workloads, spec_path=spec_path,
                           timeout=timeout, reps=reps, warmup=warmup)
    try:
        with err.status("benchmarking…") as status:
            report = run_bench(request, progress=lambda msg: status.update(msg))
    except GrpoConformError as exc:  # a refusal (no GPU, bad spec) is JSON too under --format json
        if fmt != "json":
            raise
        _emit_json({"ok": False, "refused": str(exc), "exit_code": exc.exit_code, "rows": []})
        sys.exit(exc.exit_code)
    if fmt == "json":
        _emit_json(report.to_json())
    else:
        render_bench(report, out)
    sys.exit(report.exit_code)


@main.command()
@click.option("--spec", "spec_path", required=True, help="spec file or id")
@click.option("--workload", required=True)
@click.option("--gpu", required=True, help='GPU name as in the catalogue, e.g. "A100 80GB", "H200"')
@click.option("--protocol", type=click.Choice([*PROTOCOLS, "all"]), default="forward",
              show_default=True)
@click.option("--model", type=click.Choice(["all", "traffic-v1", "headroom-v1"]), default="all", show_default=True,
              help="floor model: traffic-v1 (what must be read and written; check uses it) or headroom-v1 "
                   "(every declared tensor once, the seed page's)")
@click.option("--unmasked", type=click.FloatRange(0.0, 1.0), default=None,
              help="fraction of scored positions unmasked, for members that read unmasked rows (default: 0)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def floor(spec_path: str, workload: str, gpu: str, protocol: str, model: str, unmasked: float | None,
          fmt: str) -> None:
    """Print the DRAM and arithmetic floors of a workload on a GPU (traffic-v1 and headroom-v1), with the derivation."""
    # start-up: see the module docstring
    from grpo_conform.floors import FloorRequest, run_floor

    report = run_floor(FloorRequest(spec_path=spec_path, workload=workload, gpu=gpu, protocol=protocol, model=model,
                                    unmasked=unmasked))
    if fmt == "json":
        _emit_json(report.to_json())
    else:
        for line in report.lines():
            out.print(line, highlight=False, markup=False, soft_wrap=True)  # one line each, any width


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--spec", "spec_ref", default="grpo-token-is", show_default=True, help="spec file or id")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="every finding of every record, not one line per record")
@click.option("--against", "against", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Liger-Kernel's own benchmark CSV: tells which of its rows (token- or sequence-level) a fused-linear "
                   "number is (a FILE.source.json beside it names its commit)")
@click.option("--records", "records", multiple=True, type=click.Path(exists=True),
              help="folders or files of our records for the fused rows' reproduction (default: evidence/h200)")
@click.option("--no-reproduction", is_flag=True, help="skip reading our records")
@_fail_cleanly
def audit(files: tuple[str, ...], spec_ref: str, fmt: str, verbose: bool, against: str | None,
          records: tuple[str, ...], no_reproduction: bool) -> None:
    """Audit reported timings (Liger-Kernel benchmark CSV or grpo-conform-reported/1 JSON files): one line
    per record; exit 1 if any is impossible. Rows of Liger's fused lm_head + GRPO kernel are judged as
    that operation (docs/audit.md)."""
    # start-up: see the module docstring
    from grpo_conform.audit import AuditRequest, run_audit
    from grpo_conform.report.audit_text import compact_lines

    chosen = () if no_reproduction else (records or None)
    reports = [run_audit(AuditRequest(path=f, spec=spec_ref, against=against, records=chosen)) for f in files]
    code = max(r.exit_code for r in reports)
    if fmt == "json":  # one file: its report as before; several: {"files": [...], "exit_code"}
        _emit_json(reports[0].to_json() if len(reports) == 1 else
                   {"files": [r.to_json() for r in reports], "exit_code": code})
    else:
        for line in compact_lines(reports, verbose):
            out.print(line, highlight=False, markup=False, soft_wrap=True)
    sys.exit(code)


# -- evidence -----------------------------------------------------------------------------------
def _evidence_error(exc: GrpoConformError, fmt: str) -> None:
    """`--format json` always prints JSON, also when the command cannot start (bad trust root, policy)."""
    # start-up: see the module docstring
    from grpo_conform.evidence.terminal import safe

    if fmt == "json":
        _emit_json({"ok": False, "error": str(exc), "exit_code": exc.exit_code, "files": []})
    else:
        err.print(Text.assemble(("error: ", "bold red"), safe(str(exc), 4000)), highlight=False)
    sys.exit(exc.exit_code)


def _signers(values: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for v in values:
        impl, sep, who = v.partition("=")
        if not sep or not impl or not who:
            raise click.BadParameter(f"{v!r}: expected IMPLEMENTATION=KEYID-OR-OWNER (IMPLEMENTATION may be '*')",
                                     param_hint="--signer")
        out.setdefault(impl, []).append(who)
    return {k: tuple(v) for k, v in out.items()}


@main.command()
@click.argument("files", nargs=-1, required=True)  # no click.Path: a bad file is reported with the others
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False),
              help="policy file (JSON or TOML; fields in docs/evidence.md); the flags below override it")
@click.option("--expect-subject", help="the implementation path the record must be about")
@click.option("--expect-digest", help="the implementation identity (dirHash) the record must carry")
@click.option("--require-result", multiple=True, type=click.Choice(["PASSED", "WARNED", "FAILED"]),
              help="accepted result(s), e.g. --require-result PASSED")
@click.option("--require-verdict", multiple=True, type=click.Choice(["conformant", "failed", "skipped", "load-error"]))
@click.option("--require-full-coverage", is_flag=True,
              help="refuse partial records: a workload not run, or checks (-k), workloads (--workload, --shard) "
                   "or members (--member) left out by the run's selection")
@click.option("--require-exercised", multiple=True, metavar="CATEGORY:CASE",
              help="a case the record's coverage.exercised must list, e.g. 'ties:tie at delta' ('dtypes:*': any)")
@click.option("--require-declared-cases", is_flag=True,
              help="refuse records that did not exercise every case their spec declares (coverage.declared)")
@click.option("--spec", "spec_id", help="the spec id the record must be checked against")
@click.option("--spec-version", help="accepted spec versions, e.g. '>=1.0.0,<2.0.0'")
@click.option("--signer", multiple=True, help="IMPLEMENTATION=KEYID-OR-OWNER: who may sign for it ('*': any)")
@click.option("--hardware", help="substring of the recorded device name, e.g. H200")
@click.option("--max-age", help="maximum age of the run, e.g. 30d, 12h")
@click.option("--builder", help="prefix the record's builder id must have (e.g. a CI URL)")
@click.option("--project", type=click.Path(file_okay=False),
              help="checkout to recompute identities from (default: the one the record file is in)")
@click.option("--allow-unverified", is_flag=True,
              help="accept records whose identities cannot be recomputed here (reported as UNVERIFIED)")
@click.option("--allow-unsigned", is_flag=True, help="accept records without a signature (reported as such)")
@click.option("--trusted-keys", type=click.Path(dir_okay=False),
              help="OVERRIDE: trust this trusted-keys list instead of the trust root shipped with grpo-conform")
@click.option("--trust-root", type=click.Path(file_okay=False),
              help="OVERRIDE: trust this folder of trust metadata (1.root.json, targets.json) instead")
@click.option("--tsa-cert", multiple=True, type=click.Path(dir_okay=False),
              help="root certificate (PEM) of a time-stamping authority whose RFC 3161 tokens (RECORD.tsr) to trust")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def verify(files: tuple[str, ...], policy_file: str | None, expect_subject: str | None, expect_digest: str | None,
           require_result: tuple[str, ...], require_verdict: tuple[str, ...], require_full_coverage: bool,
           require_exercised: tuple[str, ...], require_declared_cases: bool, spec_id: str | None, spec_version: str | None, signer: tuple[str, ...], hardware: str | None,
           max_age: str | None, builder: str | None, project: str | None, allow_unverified: bool,
           allow_unsigned: bool, trusted_keys: str | None, trust_root: str | None, tsa_cert: tuple[str, ...],
           fmt: str) -> None:
    """Verify evidence records: envelope, signature (shipped trust root), schema, semantics, identities, policy.

    Exit 0 only if every file passes every step."""
    # start-up: see the module docstring
    from grpo_conform.evidence import Policy, VerifyRequest, load_policy, run_verify

    try:
        policy = load_policy(policy_file) if policy_file else Policy()
        policy = policy.merged(subject_path=expect_subject, subject_digest=expect_digest,
                               require_result=require_result, require_verdict=require_verdict,
                               require_full_coverage=require_full_coverage, spec_id=spec_id,
                               require_exercised=require_exercised, require_declared_cases=require_declared_cases,
                               spec_version=spec_version, signers=_signers(signer), hardware=hardware,
                               max_age=max_age, builder=builder)
        report = run_verify(VerifyRequest(files=files, trusted_keys=trusted_keys, allow_unsigned=allow_unsigned,
                                          trust_root=trust_root, policy=policy, allow_unverified=allow_unverified,
                                          project=project, tsa_certs=tsa_cert))
    except GrpoConformError as exc:
        _evidence_error(exc, fmt)
        return
    if fmt == "json":
        _emit_json(report.to_json())
    else:
        for line in report.lines():
            out.print(line, highlight=False, markup=False, soft_wrap=True)  # one line each, any width
    sys.exit(report.exit_code)


@main.command()
@click.option("--private-key", default="grpo-conform-signing-key.pem", show_default=True,
              type=click.Path(dir_okay=False), help="where to write the private key (mode 0600; never overwritten)")
@click.option("--public-key", default="grpo-conform-signing-key.pub.pem", show_default=True,
              type=click.Path(dir_okay=False))
@_fail_cleanly
def keygen(private_key: str, public_key: str) -> None:
    """Make an Ed25519 key pair for signing evidence records."""
    # start-up: see the module docstring
    from grpo_conform.evidence import KeygenRequest, run_keygen

    report = run_keygen(KeygenRequest(private_key=private_key, public_key=public_key))
    out.print(f"private key: {report.private_key} (keep it secret; never commit it)", highlight=False, markup=False)
    out.print(f"public key:  {report.public_key}", highlight=False, markup=False)
    out.print(f"key id:      {report.keyid}", highlight=False)
    out.print("verify trusts it only once the root keys sign it into the trust root (tools/trust-root.py), "
              "or with --trusted-keys", highlight=False)
    # How to trust it locally, ready to paste (REPORT, issue 16): the list names the key file relative to itself.

    pub = Path(report.public_key)
    listing = pub.parent / "trusted-keys.local.json"
    entry = {"format": "grpo-conform/trusted-keys/v1", "keys": [{
        "keyid": report.keyid, "public_key": pub.name, "owner": "me (local)",
        "valid_from": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT00:00:00Z"),
        "valid_until": None, "revoked": False}]}
    out.print(f"to trust it on this machine, write {listing} with:", highlight=False, markup=False)
    out.print("  " + json.dumps(entry), highlight=False, markup=False, soft_wrap=True)
    out.print(f"then: grpo-conform verify --trusted-keys {listing} RECORD...  (report takes --trusted-keys too)",
              highlight=False, markup=False, soft_wrap=True)


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--key", "key_path", type=click.Path(dir_okay=False),
              help="private key (PEM); else $GRPO_CONFORM_SIGNING_KEY or $GRPO_CONFORM_SIGNING_KEY_FILE")
@click.option("--project", type=click.Path(file_okay=False),
              help="checkout to recompute identities from (default: the one the record file is in)")
@click.option("--allow-unverified", is_flag=True, help="sign records whose identities cannot be recomputed here")
@click.option("--dry-run", is_flag=True, help="check and show what would be signed; sign nothing")
@click.option("--timestamp-query", is_flag=True,
              help="also write RECORD.tsq, the RFC 3161 query for the new signature (send it to a TSA, save RECORD.tsr)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def sign(files: tuple[str, ...], key_path: str | None, project: str | None, allow_unverified: bool, dry_run: bool,
         timestamp_query: bool, fmt: str) -> None:
    """Add a signature to existing records (e.g. made on a machine that must not hold the key).

    Refuses (and signs nothing) when any record fails what `verify` checks besides the signature."""
    # start-up: see the module docstring
    from grpo_conform.evidence import SignRequest, run_sign

    try:
        report = run_sign(SignRequest(files=files, key_path=key_path, project=project,
                                      allow_unverified=allow_unverified, dry_run=dry_run,
                                      timestamp_query=timestamp_query))
    except GrpoConformError as exc:
        _evidence_error(exc, fmt)
        return
    if fmt == "json":
        _emit_json(report.to_json())
    else:
        for line in report.lines():
            out.print(line, highlight=False, markup=False, soft_wrap=True)  # one line each, any width


# -- report (the leaderboard; REPORT owns this command) --------------------------------------------
@main.command()
@click.argument("evidence", nargs=-1, required=True)
@click.option("--reported", "reported", multiple=True, type=click.Path(dir_okay=False),
              help="third-party records to show beside the evidence with their audit verdict (Liger-Kernel "
                   "benchmark CSV or grpo-conform-reported/1 JSON; repeatable)")
@click.option("--out", default="leaderboard", show_default=True, type=click.Path(file_okay=False),
              help="folder for index.html, leaderboard.md and leaderboard.json")
@click.option("--trusted-keys", type=click.Path(dir_okay=False),
              help="trusted-keys list instead of the shipped trust root (as for verify)")
@click.option("--spec", "spec_ref", default="grpo-token-is", show_default=True,
              help="spec the reported logits-level records are audited against (fused lm_head rows: the "
                   "fused-linear spec, as `audit` does)")
@click.option("--against", "against", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Liger-Kernel's own benchmark CSV, forwarded to the audit (`audit --against`): which of its rows "
                   "(token- or sequence-level) a reported fused-linear number is")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True,
              help="what to print (the three files are written whatever it is)")
@click.option("--project", type=click.Path(file_okay=False), help="the checkout that resolves members and "
              "implementation identities (default: the current directory's)")
@click.option("--sweep", "sweeps", multiple=True, help="a shape sweep of the logits kernel (the JSON of "
              "benchmarks/sweep_logits.py --out) to show in its own section, apart from the signed records; repeatable")
@_fail_cleanly
def report(evidence: tuple[str, ...], reported: tuple[str, ...], out: str, trusted_keys: str | None, spec_ref: str,
           fmt: str, project: str | None = None, against: str | None = None, sweeps: tuple[str, ...] = ()) -> None:
    """Build the leaderboard (HTML, Markdown, JSON) from evidence records, files or folders of
    *.intoto.json, showing only those that pass verify; exit 0 once the page is written."""
    # start-up: see the module docstring
    from grpo_conform.report.build import ReportRequest
    from grpo_conform.report.write import render, run_report

    board = run_report(ReportRequest(paths=evidence, reported=reported, out=out, trusted_keys=trusted_keys,
                                     spec=spec_ref, project=project, against=against, sweeps=sweeps))
    if fmt in ("json", "markdown"):
        click.echo(render(board, fmt), nl=False)
        return
    click.echo(f"{len(board.inputs)} record(s) verified and shown in {len(board.sections)} section(s); "
               f"{len(board.reported)} reported record(s) audited; {len(board.rejected)} record(s) not shown")
    for r in board.rejected:
        click.echo(f"  not shown: {r.path}: {r.reason}")
    for sw in board.sweeps:
        click.echo(f"shape sweep on {sw.gpu or 'no GPU'} (unsigned benchmark output): {len(sw.cells)} row(s) from "
                   f"{len(sw.files)} file(s); {sum(t.met for t in sw.targets)} of {len(sw.targets)} target(s) met")
        for where, why in sw.set_aside:
            click.echo(f"  sweep not shown: {where}: {why}")
    for w in board.written:
        click.echo(f"wrote {w}")


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(EXIT_OK)
