"""The command line. Each command parses its options into a request object and hands it to the
library; only this module prints and exits. A `GrpoConformError` becomes its message on stderr
and its exit code (2 usage/spec/manifest, 3 environment); anything else is a bug."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable

import click
from rich.console import Console
from rich.text import Text

from grpo_conform import __version__
from grpo_conform.errors import EXIT_OK, GrpoConformError
from grpo_conform.floors import PROTOCOLS

out = Console(soft_wrap=False, width=200)
err = Console(stderr=True, soft_wrap=True)  # an error stays one line, also when stderr is not a terminal


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
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def spec_show(file: str, fmt: str) -> None:
    """Print a spec's id, version, sha256 identity and a readable summary."""
    from grpo_conform.render import render_spec
    from grpo_conform.spec import load_spec

    loaded = load_spec(file)
    if fmt == "json":
        _emit_json({"id": loaded.id, "version": loaded.version, "identity": {"sha256": loaded.identity},
                    "path": loaded.source, "summary": loaded.summary_lines()})
    else:
        render_spec(loaded, out)


@spec.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_fail_cleanly
def spec_validate(files: tuple[str, ...]) -> None:
    """Validate spec files against the schema and their own cross-references."""
    from grpo_conform.spec import load_spec

    for file in files:
        loaded = load_spec(file)
        out.print(f"{file}: valid ({loaded.id} {loaded.version}, sha256 {loaded.identity})", highlight=False)


# -- check --------------------------------------------------------------------------------------
@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto = cuda when available")
@click.option("--workload", "workloads", multiple=True, help="run only this workload of the spec (repeatable)")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), help="spec file (default: the manifest's spec id)")
@click.option("--timeout", type=float, help="seconds one worker step may take (default: scaled by the workload)")
@click.option("--no-timing", is_flag=True, help="skip the timed protocols on CUDA")
@click.option("--evidence-dir", default="grpo-conform-evidence", show_default=True, type=click.Path(file_okay=False),
              help="where the evidence records (DSSE envelopes) are written")
@click.option("--no-evidence", is_flag=True, help="write no evidence record")
@click.option("--key", "key_path", type=click.Path(dir_okay=False),
              help="Ed25519 private key (PEM) to sign records; else $GRPO_CONFORM_SIGNING_KEY (PEM) or "
                   "$GRPO_CONFORM_SIGNING_KEY_FILE (path); none: records are written unsigned")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def check(paths: tuple[str, ...], device: str, workloads: tuple[str, ...], spec_path: str | None,
          timeout: float | None, no_timing: bool, evidence_dir: str, no_evidence: bool, key_path: str | None,
          fmt: str) -> None:
    """Check implementation folders against their spec; exit 0 conformant, 1 failed, 2 usage, 3 environment."""
    from grpo_conform.check import CheckRequest, run_check
    from grpo_conform.evidence import load_signing_key, write_evidence
    from grpo_conform.render import render_check

    key = None if no_evidence else load_signing_key(key_path)  # a bad key fails before anything runs
    request = CheckRequest(paths=paths, device=device, workloads=workloads, spec_path=spec_path,
                           timeout=timeout, timing=not no_timing)
    with err.status("checking…") as status:
        report = run_check(request, progress=lambda msg: status.update(msg))
    records = () if no_evidence else write_evidence(report, evidence_dir, key)
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
    sys.exit(report.exit_code)


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
    from grpo_conform.bench import BenchRequest, run_bench
    from grpo_conform.render import render_bench

    request = BenchRequest(paths=paths, protocols=protocols or ("full",), workloads=workloads, spec_path=spec_path,
                           timeout=timeout, reps=reps, warmup=warmup)
    with err.status("benchmarking…") as status:
        report = run_bench(request, progress=lambda msg: status.update(msg))
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
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def floor(spec_path: str, workload: str, gpu: str, protocol: str, fmt: str) -> None:
    """Print the DRAM (headroom-v1) and arithmetic floors of a workload on a GPU, with the derivation."""
    from grpo_conform.floors import FloorRequest, run_floor

    report = run_floor(FloorRequest(spec_path=spec_path, workload=workload, gpu=gpu, protocol=protocol))
    if fmt == "json":
        _emit_json(report.to_json())
    else:
        for line in report.lines():
            out.print(line, highlight=False, markup=False)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--spec", "spec_ref", default="grpo-token-is", show_default=True, help="spec file or id")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def audit(file: str, spec_ref: str, fmt: str) -> None:
    """Audit reported timings (Liger-Kernel benchmark CSV or grpo-conform-reported/1 JSON): exit 1 if any is impossible."""
    from grpo_conform.audit import AuditRequest, run_audit

    report = run_audit(AuditRequest(path=file, spec=spec_ref))
    if fmt == "json":
        _emit_json(report.to_json())
    else:
        for line in report.lines():
            out.print(line, highlight=False, markup=False)
    sys.exit(report.exit_code)


# -- evidence -----------------------------------------------------------------------------------
@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--trusted-keys", type=click.Path(dir_okay=False),
              help="trusted-keys list (default: ./evidence/keys/trusted-keys.json, else the checkout's)")
@click.option("--allow-unsigned", is_flag=True, help="accept records without a signature (reported as such)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def verify(files: tuple[str, ...], trusted_keys: str | None, allow_unsigned: bool, fmt: str) -> None:
    """Verify evidence records: envelope, signature against trusted keys, schema, identities. Exit 0 only if all hold."""
    from grpo_conform.evidence import VerifyRequest, run_verify
    from grpo_conform.render import render_verify

    report = run_verify(VerifyRequest(files=files, trusted_keys=trusted_keys, allow_unsigned=allow_unsigned))
    if fmt == "json":
        _emit_json(report.to_json())
    else:
        render_verify(report, out)
    sys.exit(report.exit_code)


@main.command()
@click.option("--private-key", default="grpo-conform-signing-key.pem", show_default=True,
              type=click.Path(dir_okay=False), help="where to write the private key (mode 0600; never overwritten)")
@click.option("--public-key", default="grpo-conform-signing-key.pub.pem", show_default=True,
              type=click.Path(dir_okay=False))
@_fail_cleanly
def keygen(private_key: str, public_key: str) -> None:
    """Make an Ed25519 key pair for signing evidence records."""
    from grpo_conform.evidence import KeygenRequest, run_keygen

    report = run_keygen(KeygenRequest(private_key=private_key, public_key=public_key))
    out.print(f"private key: {report.private_key} (keep it secret; never commit it)", highlight=False)
    out.print(f"public key:  {report.public_key}", highlight=False)
    out.print(f"key id:      {report.keyid}", highlight=False)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--key", "key_path", type=click.Path(dir_okay=False),
              help="private key (PEM); else $GRPO_CONFORM_SIGNING_KEY or $GRPO_CONFORM_SIGNING_KEY_FILE")
@_fail_cleanly
def sign(files: tuple[str, ...], key_path: str | None) -> None:
    """Add a signature to existing records (e.g. made on a machine that must not hold the key)."""
    from grpo_conform.evidence import SignRequest, run_sign

    report = run_sign(SignRequest(files=files, key_path=key_path))
    for r in report.records:
        out.print(f"signed {r.path} (key {report.keyid[:16]}…)", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(EXIT_OK)
