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

out = Console(soft_wrap=False, width=200)
err = Console(stderr=True)


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
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_fail_cleanly
def check(paths: tuple[str, ...], device: str, workloads: tuple[str, ...], spec_path: str | None,
          timeout: float | None, no_timing: bool, fmt: str) -> None:
    """Check implementation folders against their spec; exit 0 conformant, 1 failed, 2 usage, 3 environment."""
    from grpo_conform.check import CheckRequest, run_check
    from grpo_conform.render import render_check

    request = CheckRequest(paths=paths, device=device, workloads=workloads, spec_path=spec_path,
                           timeout=timeout, timing=not no_timing)
    with err.status("checking…") as status:
        report = run_check(request, progress=lambda msg: status.update(msg))
    if fmt == "json":
        _emit_json(report.to_json())
    else:
        render_check(report, out)
    sys.exit(report.exit_code)


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(EXIT_OK)
