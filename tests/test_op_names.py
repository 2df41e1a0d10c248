"""GRPO-specific names stay with the operations (issue 30, "Done when"): the tensor names of GRPO over
logits (`logits`, `vocab`, `completion_ids`, `advantages`) appear only under grpo_conform/ops/ and in the
spec package (grpo_conform/spec/, whose format declares each operation's inputs by name) and its
schemas, except in the files listed below, each with its reason.

How a file is read: Python's tokenizer splits it into code (names, string literals) and prose (comments
and docstrings, found with `ast`). A file whose CODE names one of them must be listed as "code"; a file
that names them only in prose must be listed as "prose" (comments and docstrings that explain in GRPO's
words, which generic code may keep). A name joined to another word by a hyphen or an underscore is part
of an identifier, not the tensor's name: the operation `grpo-logits`, the check `non-leaf-logits`, the
workload `odd-vocab`, the record field `peak_over_logits` (each an identity that records and specs carry).

The test fails on a new file outside the list, on a "prose" file whose code now names them, and on an entry
that no longer names them (or a "code" entry whose code no longer does: list it as "prose").
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_conform"
NAMES = re.compile(r"(?<![\w-])(logits|vocab|completion_ids|advantages)(?![\w-])")
OWNED = ("ops/", "spec/", "schemas/")  # the operations, the spec format and its schemas: the names' home

# path under grpo_conform/ -> (where the names appear: "code" or "prose", why they may)
EXCEPTIONS: dict[str, tuple[str, str]] = {
    # -- code ---------------------------------------------------------------------------------------------
    "audit.py": ("code", "reads GRPO leaderboard rows (Liger-Kernel's benchmark CSV columns B, T, V) and maps "
                         "their axes onto the seed spec's batch, seq and vocab"),
    "scaffold.py": ("code", "`init` writes a starter implementation of grpo-logits: its source text is GRPO "
                            "over logits by design (other operations get a clear error)"),
    "operations.py": ("code", "other sources' operation names, described in words (GrpoLossFunction on "
                              "materialized logits, a fused linear whose logits never exist)"),
    "checks/timed.py": ("code", "the timed summary's text 'peak N x logits' beside the record field "
                                "peak_over_logits (timed records carry both as they are)"),
    "render.py": ("code", "the terminal shows a workload's shape as batch x seq_next x vocab, as the committed "
                          "README transcripts and records' readers show it"),
    "report/model.py": ("code", "the leaderboard's shape text reads the seed family's axes and the logits "
                                "dtype of committed records"),
    "checks/registry.py": ("code", "the checks' descriptions (the text docs/checks.md shows) name the logits and "
                                   "advantages each check changes"),
    "cli.py": ("code", "--explore's help text lists what grpo-logits' explorer draws (dtypes, parameters, "
                       "advantages)"),
    "report/tables.py": ("code", "the leaderboard's peak-memory text 'N x logits' beside the record field "
                                 "peak_over_logits"),
    "report/sweep.py": ("code", "reads benchmarks/sweep_logits.py's JSON: its rows are grpo-logits shapes (vocab, "
                                "batch, seq) whose floors are the logits' bytes; a benchmark of that one operation"),
    "report/sweep_tables.py": ("code", "the sweep section's text and columns: per vocab, torch's copy_ of the same "
                                       "logits (a grpo-logits benchmark)"),
    # -- prose --------------------------------------------------------------------------------------------
    "check.py": ("prose", "the module docstring's example and the draw-shrinking note (drawn-bf16's vocab)"),
    "compare.py": ("prose", "the comparator's and the fp32 floors' docstrings derive their bounds on logits "
                            "rows (fp32_floor, fp32_logp_error, fp32_target_floor)"),
    "floors.py": ("prose", "the floors' docstrings give grpo-logits' traffic and exponentials as the example"),
    "checks/rewritten.py": ("prose", "the module docstring names the inputs a caller refills (advantages, ids, "
                            "mask) to say what the probe's calls rewrite; its code takes them from the spec"),
    "checks/reach.py": ("prose", "the module docstring names the default workloads' sizes (batch, rows, vocab, "
                                 "hidden) and the kernels' mistakes the probe reaches; its shapes are grpo_probes'"),
    "checks/conformance.py": ("prose", "comments on the buffers' sizes (logits-sized at seq 65,536) and on what "
                                       "the first differentiable input is"),
    "checks/calls.py": ("prose", "the comment on the row checks: properties of d logits rows, not applicable where "
                                 "a spec gives no logits"),
    "checks/judge_calls.py": ("prose", "the comment on the fused operation's reference loss (no given logits)"),
    "checks/probes.py": ("prose", "the probes' docstrings (docs/checks.md's text) name the logits they hand over"),
    "checks/buffers.py": ("prose", "only_gradient's docstring and error say why one gradient (GRPO over logits)"),
    "checks/reference_cache.py": ("prose", "the docstring lists what one cached entry depends on"),
    "isolation/sharing.py": ("prose", "a comment gives logits[:, :, :V] as the example of a strided view"),
    "gate/shard.py": ("prose", "a comment sizes the weighing unit in logits"),
    "report/plot.py": ("prose", "the docstring names the seed's seq x vocab ladder"),
    "report/fused.py": ("prose", "the docstrings say how a fused section differs from the logits sections"),
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def scan(source: str) -> tuple[list[int], list[int]]:
    """(lines where code names one of NAMES, lines where only prose does), each sorted, without repeats."""
    docs = _docstring_lines(ast.parse(source))
    code: set[int] = set()
    prose: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT) or not NAMES.search(tok.string):
            continue
        is_doc = tok.type == tokenize.STRING and tok.start[0] in docs and tok.end[0] in docs
        (prose if tok.type == tokenize.COMMENT or is_doc else code).add(tok.start[0])
    return sorted(code), sorted(prose - code)


def found() -> dict[str, tuple[list[int], list[int]]]:
    out = {}
    for file in sorted(PACKAGE.rglob("*.py")):
        rel = file.relative_to(PACKAGE).as_posix()
        if rel.startswith(OWNED):
            continue
        code, prose = scan(file.read_text(encoding="utf-8"))
        if code or prose:
            out[rel] = (code, prose)
    return out


def test_the_scanner_tells_code_from_prose():
    src = ('"""Docstring naming the logits."""\n'
           'import torch  # the advantages\n'
           'def f(x):\n'
           '    """d logits rows."""\n'
           '    op = "grpo-logits"; check = "non-leaf-logits"; key = "peak_over_logits"\n'
           '    return x["completion_ids"]\n')
    assert scan(src) == ([6], [1, 2, 4])
    assert scan('v = spec.axes["vocab"]\n') == ([1], [])
    assert scan('x = 1\n') == ([], [])


def test_grpo_names_stay_in_the_operations():
    problems = []
    for rel, (code, prose) in found().items():
        kind = EXCEPTIONS.get(rel, (None, ""))[0]
        if code and kind != "code":
            problems.append(f"grpo_conform/{rel}: code names GRPO inputs on lines {code[:8]}: move that code under "
                            "grpo_conform/ops/ (or ask the operation), or list the file here as 'code' with its reason")
        elif not code and kind is None:
            problems.append(f"grpo_conform/{rel}: comments or docstrings name GRPO inputs on lines {prose[:8]}: "
                            "list the file here as 'prose' with its reason, or reword")
    assert not problems, "\n".join(problems)


def test_every_exception_is_current_and_has_a_reason():
    seen = found()
    stale = []
    for rel, (kind, why) in EXCEPTIONS.items():
        assert kind in ("code", "prose") and why, f"{rel}: an exception needs its kind and its reason"
        if rel not in seen:
            stale.append(f"{rel}: names no GRPO input any more: drop it from EXCEPTIONS")
        elif kind == "code" and not seen[rel][0]:
            stale.append(f"{rel}: only its prose names GRPO inputs now: list it as 'prose'")
    assert not stale, "\n".join(stale)
