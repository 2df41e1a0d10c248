"""The spec and its schema: loading, identity, every kind of broken file, resolution, and the spec
as the single source the validator reads (tolerances, workloads), through the library and the CLI."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import subprocess
import sys

import pytest
import rfc8785

from conftest import ROOT, SPEC_FILE, cli_here
from grpo_conform.compare import compare_loss
from grpo_conform.spec import ENV_SPEC_DIRS, SpecError, find_spec, load_spec, validate_document


def _doc() -> dict:
    return json.loads(SPEC_FILE.read_text(encoding="utf-8"))


def _write(tmp_path, doc, name="variant.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return str(path)


def _workload_index(doc, name) -> int:
    return next(i for i, w in enumerate(doc["workloads"]) if w["name"] == name)


def _shuffled(value, rng: random.Random):
    """The same JSON value with every object's keys in a random order (lists keep their order)."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: _shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _cli(*args, cwd=ROOT):
    """In this process (conftest.cli_here), $COLUMNS 1000: rich wraps stderr at 80 columns otherwise."""
    return cli_here(*args, cwd=cwd)


# -- the bundled spec -------------------------------------------------------------------------------
def test_bundled_spec_loads_validates_and_its_identity_is_the_sha256_of_its_jcs_bytes(spec):
    doc = _doc()
    validate_document(doc, SPEC_FILE)  # raises on any problem
    expected = hashlib.sha256(rfc8785.dumps(doc)).hexdigest()
    assert spec.identity == expected
    assert len(spec.identity) == 64 and spec.identity == spec.identity.lower()
    assert spec.id == "grpo-token-is" and spec.version == "1.0.0"
    assert spec.source == str(SPEC_FILE)
    # The file is not stored canonically, so hashing the raw bytes would give another value.
    assert hashlib.sha256(SPEC_FILE.read_bytes()).hexdigest() != expected


def test_bundled_spec_content_is_what_the_semantics_say(spec):
    assert [a.name for a in spec.axes] == ["batch", "seq", "seq_next", "vocab"]
    assert spec.parameter_values == {"epsilon_low": 0.2, "epsilon_high": 0.2, "temperature": 1.0}
    assert spec.differentiable_input.name == "logits"
    assert spec.input("completion_ids").range.max_exclusive == "vocab"
    assert {t.dtype for t in spec.tolerances} == {"bfloat16", "float16", "float32"}
    assert spec.gradients[0].exact_zero.axis == "seq_next" and spec.gradients[0].exact_zero.index == -1
    assert not spec.terms.kl.present and not spec.terms.mask.present


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identity_ignores_whitespace_and_key_order(tmp_path, spec, seed):
    doc = _shuffled(_doc(), random.Random(seed))
    assert json.dumps(doc) != json.dumps(_doc())  # key order really changed
    assert doc == _doc()
    indent = [None, 1, 7][seed]
    separators = [(",", ":"), (" ,  ", " :\t"), (",", ": ")][seed]
    path = tmp_path / "reformatted.json"
    path.write_text(json.dumps(doc, indent=indent, separators=separators) + "\n\n", encoding="utf-8")
    assert path.read_bytes() != SPEC_FILE.read_bytes()
    assert load_spec(path).identity == spec.identity


SEMANTIC_EDITS = {
    "bf16 gradient element_rtol": (("tolerances", 0, "gradient", "element_rtol"), 0.02),
    "fp32 loss atol": (("tolerances", 2, "loss", "atol"), 2e-6),
    "workload axis vocab": (("workloads", "odd-vocab", "axes", "vocab"), 5005),
    "workload axis range max": (("workloads", "drawn-bf16", "axes", "seq", "max"), 10),
    "parameter epsilon_high": (("parameters", 1, "value"), 0.28),
    "parameter temperature": (("parameters", 2, "value"), 0.7),
    "workload logits dtype": (("workloads", "small-bf16", "dtypes", "logits"), "float16"),
    "input dtype list": (("inputs", 0, "dtypes"), ["bfloat16", "float16", "float32", "float64"]),
    "determinism": (("constraints", "determinism"), "bitwise"),
    "advantage mean": (("validation", "advantages", "mean"), 0.8),
    "a description": (("axes", 0, "description"), "sequences"),
}


def _set(doc, path, value):
    node = doc
    for key in path[:-1]:
        if isinstance(node, list) and isinstance(key, str):
            key = next(i for i, item in enumerate(node) if item.get("name") == key)
        node = node[key]
    assert path[-1] in node if isinstance(node, dict) else path[-1] < len(node)
    assert node[path[-1]] != value
    node[path[-1]] = value


@pytest.mark.parametrize("edit", list(SEMANTIC_EDITS), ids=list(SEMANTIC_EDITS))
def test_identity_changes_with_any_field(tmp_path, spec, edit):
    path, value = SEMANTIC_EDITS[edit]
    doc = _doc()
    _set(doc, path, value)
    changed = load_spec(_write(tmp_path, doc))
    assert changed.identity != spec.identity
    assert changed.identity == hashlib.sha256(rfc8785.dumps(doc)).hexdigest()


# -- broken spec files ------------------------------------------------------------------------------
def _drop(*path):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return edit


def _put(*path_and_value):
    *path, value = path_and_value

    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


ODD = 5  # index of odd-vocab in the bundled spec (checked below)
BROKEN = {
    "missing required field": (_drop("title"), "$", "missing required field: 'title' is a required property"),
    "missing nested field": (_drop("tolerances", 1, "gradient", "frobenius_rtol"), "$.tolerances[1].gradient",
                             "missing required field: 'frobenius_rtol' is a required property"),
    "wrong type": (_put("tolerances", 0, "loss", "atol", "1e-5"), "$.tolerances[0].loss.atol",
                   'got "1e-5", expected a value of type number'),
    "wrong type in a workload": (_put("workloads", ODD, "devices", "cpu"), f"$.workloads[{ODD}].devices",
                                 'got "cpu", expected a value of type array'),
    "unknown key": (_put("colour", "blue"), "$",
                    "Additional properties are not allowed ('colour' was unexpected); allowed keys are in the "
                    "spec schema"),
    "unknown nested key": (_put("constraints", "no_mutatoin", True), "$.constraints",
                           "Additional properties are not allowed ('no_mutatoin' was unexpected)"),
    "bad enum": (_put("constraints", "determinism", "sometimes"), "$.constraints.determinism",
                 'got "sometimes", expected ["unspecified", "bitwise"]'),
    "bad const": (_put("format", "grpo-conform-spec/9"), "$.format",
                  'got "grpo-conform-spec/9", expected "grpo-conform-spec/1"'),
    "negative tolerance": (_put("tolerances", 2, "gradient", "element_atol", -1.0),
                           "$.tolerances[2].gradient.element_atol", "-1.0 is less than the minimum of 0"),
    "axis equals an unknown axis": (_put("axes", 2, "equals", "sequence + 1"), "$.axes[2].equals",
                                    "'sequence + 1' must refer to another declared axis "
                                    "(['batch', 'seq', 'seq_next', 'vocab'])"),
    "axis equals itself": (_put("axes", 2, "equals", "seq_next + 1"), "$.axes[2].equals",
                           "'seq_next + 1' must refer to another declared axis"),
    "workload missing an axis": (_drop("workloads", ODD, "axes", "vocab"), f"$.workloads[{ODD}].axes",
                                 "missing axis 'vocab' (every non-derived axis needs a value)"),
    "workload gives the derived axis": (_put("workloads", ODD, "axes", "seq_next", 6),
                                        f"$.workloads[{ODD}].axes.seq_next",
                                        "'seq_next' is derived (seq_next = ...); do not give it a value"),
    "workload unknown axis": (_put("workloads", ODD, "axes", "heads", 4), f"$.workloads[{ODD}].axes.heads",
                              "unknown axis 'heads'"),
    "workload range upside down": (_put("workloads", 9, "axes", "seq", {"min": 9, "max": 1}),
                                   "$.workloads[9].axes.seq", "max must not be below min"),
    "workload vocab below its minimum": (_put("workloads", ODD, "axes", "vocab", 1), f"$.workloads[{ODD}].axes.vocab",
                                         "vocab must be at least 2"),
    "workload dtype not allowed by the input": (_put("workloads", ODD, "dtypes", "logits", "float64"),
                                                f"$.workloads[{ODD}].dtypes.logits",
                                                "got 'float64', expected one of ['bfloat16', 'float16', 'float32']"),
    "workload dtype for an unknown input": (_put("workloads", ODD, "dtypes", "old_logprobs", "float32"),
                                            f"$.workloads[{ODD}].dtypes.old_logprobs", "unknown input 'old_logprobs'"),
    "shape refers to an undeclared axis": (_put("inputs", 0, "shape", ["batch", "seq_next", "vocabulary"]),
                                           "$.inputs[0].shape[2]",
                                           "unknown axis 'vocabulary'; declared axes: "
                                           "['batch', 'seq', 'seq_next', 'vocab']"),
    "range bound refers to an undeclared axis": (_put("inputs", 1, "range", {"min": 0, "max_exclusive": "v"}),
                                                 "$.inputs[1].range.max_exclusive", "unknown axis 'v'"),
    "duplicate workload name": (_put("workloads", ODD + 1, "name", "odd-vocab"), f"$.workloads[{ODD + 1}].name",
                                "duplicate name 'odd-vocab'"),
    "unknown profile": (_put("validation", "base_profiles", ["normal", "spiky"]), "$.validation.base_profiles[1]",
                        "unknown profile 'spiky'"),
    "two differentiable inputs": (_put("inputs", 2, "differentiable", True), "$.inputs",
                                  "exactly one input must be differentiable, found 2"),
    "exact zero on a foreign axis": (_put("gradients", 0, "exact_zero", {"axis": "seq", "index": -1}),
                                     "$.gradients[0].exact_zero.axis", "'seq' is not an axis of logits"),
}


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_broken_spec_names_file_path_and_expectation(tmp_path, case):
    edit, where, problem = BROKEN[case]
    doc = _doc()
    assert doc["workloads"][ODD]["name"] == "odd-vocab" and doc["workloads"][9]["name"] == "drawn-bf16"
    edit(doc)
    file = _write(tmp_path, doc, "broken.json")
    with pytest.raises(SpecError) as info:
        load_spec(file)
    exc = info.value
    assert exc.file == file
    assert exc.path == where
    assert problem in exc.problem, exc.problem
    assert str(exc) == f"{file}: at {where}: {exc.problem}"


def test_invalid_json_gives_line_and_column(tmp_path):
    text = SPEC_FILE.read_text(encoding="utf-8").splitlines()
    line = next(i for i, t in enumerate(text) if t.strip().startswith('"version"'))
    text[line] = text[line].rstrip(",") + ",,"  # a second comma: invalid JSON at a known place
    path = tmp_path / "invalid.json"
    path.write_text("\n".join(text), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    column = len(text[line])  # the second comma, 1-based
    assert info.value.path == f"line {line + 1} column {column}"
    assert info.value.problem.startswith("not valid JSON: ")
    assert str(info.value).startswith(f"{path}: at line {line + 1} column {column}: not valid JSON")


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.json"
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == f"{path}: at $: file not found"


def test_a_spec_that_is_not_an_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.path == "$" and "expected a value of type object" in info.value.problem


# -- resolution ------------------------------------------------------------------------------------
def test_resolve_derives_seq_next_and_takes_shapes_from_the_spec(spec):
    rw = spec.resolve(spec.workload("odd-vocab"))
    assert rw.axes == {"batch": 3, "seq": 5, "seq_next": 6, "vocab": 5003}
    assert rw.shapes == {"logits": (3, 6, 5003), "completion_ids": (3, 5), "advantages": (3,)}
    assert rw.dtypes == {"logits": "bfloat16", "advantages": "float32"}
    assert rw.numel("logits") == 3 * 6 * 5003 and rw.name == "odd-vocab"
    one = spec.resolve(spec.workload("batch1-seq1"))
    assert one.axes["seq_next"] == 2 and one.shapes["logits"] == (1, 2, 4099)


def test_resolve_follows_an_edited_derivation(tmp_path):
    doc = _doc()
    doc["axes"][2]["equals"] = "seq + 3"
    changed = load_spec(_write(tmp_path, doc))
    rw = changed.resolve(changed.workload("odd-vocab"))
    assert rw.axes["seq_next"] == 8 and rw.shapes["logits"] == (3, 8, 5003)


def test_drawn_workloads_stay_within_their_ranges_and_vary(spec):
    w = spec.workload("drawn-bf16")
    assert w.drawn and not spec.workload("odd-vocab").drawn
    ranges = {k: (v.min, v.max) for k, v in w.axes.items()}
    seen = {k: set() for k in ranges}
    rng = random.Random(1234)
    for _ in range(300):
        rw = spec.resolve(w, rng)
        for k, (lo, hi) in ranges.items():
            assert lo <= rw.axes[k] <= hi
            seen[k].add(rw.axes[k])
        assert rw.axes["seq_next"] == rw.axes["seq"] + 1
        assert rw.shapes["logits"] == (rw.axes["batch"], rw.axes["seq"] + 1, rw.axes["vocab"])
    assert seen["batch"] == set(range(1, 5))  # both ends are reachable
    assert min(seen["seq"]) == 1 and max(seen["seq"]) == 9
    assert len(seen["vocab"]) > 100


def test_same_rng_state_gives_the_same_draw(spec):
    w = spec.workload("drawn-bf16")
    assert spec.resolve(w, random.Random(7)).axes == spec.resolve(w, random.Random(7)).axes


# -- the spec drives the validator -------------------------------------------------------------------
def test_loss_allowance_is_read_from_the_spec(tmp_path, spec):
    doc = _doc()
    doc["tolerances"][0]["loss"] = {"atol": 0.25, "rtol": 0.5}
    changed = load_spec(_write(tmp_path, doc))
    before = compare_loss(-0.3, -0.5, spec.tolerance("bfloat16").loss)
    after = compare_loss(-0.3, -0.5, changed.tolerance("bfloat16").loss)
    assert before.allowed == pytest.approx(1e-5 + 1e-5 * 0.5) and not before.passed
    assert after.allowed == pytest.approx(0.25 + 0.5 * 0.5) and after.passed
    # Only the bfloat16 entry changed.
    assert changed.tolerance("float32") == spec.tolerance("float32")


def test_gradient_tolerance_is_read_from_the_spec(tmp_path, spec):
    doc = _doc()
    doc["tolerances"][2]["gradient"]["element_rtol"] = 0.125
    changed = load_spec(_write(tmp_path, doc))
    assert changed.tolerance("float32").gradient.element_rtol == 0.125
    assert spec.tolerance("float32").gradient.element_rtol == 0.005


def test_unknown_tolerance_dtype(spec):
    with pytest.raises(SpecError) as info:
        spec.tolerance("float64")
    assert info.value.path == "$.tolerances" and "no tolerance for dtype 'float64'" in info.value.problem


def test_a_new_workload_is_listed_and_a_removed_device_is_not(tmp_path, spec):
    doc = _doc()
    doc["workloads"].append({"name": "tiny-added", "axes": {"batch": 2, "seq": 3, "vocab": 97},
                             "dtypes": {"logits": "float32", "advantages": "float32"}, "devices": ["cpu"]})
    doc["workloads"][_workload_index(doc, "small-bf16")]["devices"] = ["cuda"]
    changed = load_spec(_write(tmp_path, doc))
    names = [w.name for w in changed.workloads_for("cpu")]
    assert "tiny-added" in names and "small-bf16" not in names
    assert "tiny-added" not in [w.name for w in changed.workloads_for("cuda")]
    assert [w.name for w in spec.workloads_for("cpu")] == [
        "small-bf16", "odd-vocab", "batch1-seq1", "fp32-small", "fp16-small", "drawn-bf16"]
    added = changed.workload("tiny-added")
    assert added.seeds == 2 and added.timed is False  # the schema's defaults
    assert changed.resolve(added).shapes["logits"] == (2, 4, 97)


def test_unknown_workload_lists_the_known_ones(spec):
    with pytest.raises(SpecError) as info:
        spec.workload("nope")
    assert info.value.path == "$.workloads"
    assert "no workload named 'nope' (known: seed-b2, seed-b4" in info.value.problem
    assert "drawn-bf16)" in info.value.problem


# -- finding specs ---------------------------------------------------------------------------------
def test_find_spec_by_id_and_by_id_at_version(spec):
    # decision spec-alias (docs/decisions.md): the unversioned id names the family member (same loss, checked harder), the
    # versioned one the frozen file
    member = find_spec("grpo-token-is")
    assert member.id == "grpo/token-is" and member.member == "token-is" and member.identity != spec.identity
    assert find_spec("grpo-token-is@1.0.0").identity == spec.identity


@pytest.mark.parametrize("reference", ["no-such-spec", "grpo-token-is@9.9.9"])
def test_find_spec_unknown_id_or_version(reference):
    with pytest.raises(SpecError) as info:
        find_spec(reference)
    assert info.value.file == reference
    assert ENV_SPEC_DIRS in str(info.value) and "GRPO_CONFORM_SPECS" in str(info.value)
    assert "pass --spec FILE" in str(info.value)


def test_find_spec_rejects_a_malformed_reference():
    with pytest.raises(SpecError) as info:
        find_spec("Not A Spec")
    assert "expected a spec id such as 'grpo-token-is'" in str(info.value)


def test_find_spec_searches_the_environment_directory_and_takes_the_highest_version(tmp_path, monkeypatch, spec):
    doc = _doc()
    doc["version"] = "1.10.0"  # numerically above 1.9.0, below it as a string
    _write(tmp_path, doc, "newer.json")
    doc["version"] = "1.9.0"
    _write(tmp_path, doc, "older.json")
    (tmp_path / "garbage.json").write_text("{ not json")  # skipped, not fatal
    monkeypatch.setenv(ENV_SPEC_DIRS, str(tmp_path))
    assert find_spec("grpo-token-is").id == "grpo/token-is"  # the family in the checkout's specs/ wins unversioned
    assert find_spec("grpo-token-is@1.9.0").version == "1.9.0"
    assert find_spec("grpo-token-is@1.0.0").identity == spec.identity
    assert find_spec("grpo-token-is", dirs=[tmp_path]).source == str(tmp_path / "newer.json")


# -- the CLI ---------------------------------------------------------------------------------------
def test_cli_spec_show(spec):
    run = _cli("spec", "show", str(SPEC_FILE))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "id:       grpo-token-is" in lines
    assert "version:  1.0.0" in lines
    assert f"identity: sha256 {spec.identity}" in lines
    stripped = [line.strip() for line in lines]  # the REPORT layout indents summary lines under headings
    assert "axes: batch, seq, seq_next = seq + 1, vocab" in stripped
    assert any(line.startswith("workload odd-vocab: batch=3, seq=5, vocab=5003;") for line in stripped)


def test_cli_spec_show_json(spec):
    run = _cli("spec", "show", str(SPEC_FILE), "--format", "json")
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    assert shown["identity"] == {"sha256": spec.identity}
    assert shown["id"] == "grpo-token-is" and shown["version"] == "1.0.0"


def test_cli_spec_validate_ok(spec):
    run = _cli("spec", "validate", str(SPEC_FILE))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"{SPEC_FILE}: valid (grpo-token-is 1.0.0, sha256 {spec.identity})"


def test_cli_spec_validate_broken_file(tmp_path):
    doc = _doc()
    doc["workloads"][ODD]["axes"]["seq_next"] = 6
    file = _write(tmp_path, doc, "broken.json")
    run = _cli("spec", "validate", str(SPEC_FILE), file)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    # validate lists every problem of every file on stdout (REPORT's polish), then exits 2
    assert f"{file}: INVALID (1 problem(s))" in run.stdout
    assert (f"{file}: at $.workloads[{ODD}].axes.seq_next: 'seq_next' is derived "
            "(seq_next = ...); do not give it a value") in run.stdout


def test_cli_spec_validate_invalid_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x",\n  "version": }\n')
    run = _cli("spec", "validate", str(bad))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"{bad}: at line 2 column 14: not valid JSON" in run.stdout
    run = _cli("spec", "show", str(tmp_path / "missing.json"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"{tmp_path / 'missing.json'}: at $: file not found" in run.stderr


def test_cli_spec_validate_error_survives_a_narrow_terminal(tmp_path):
    """Without COLUMNS, rich wraps at 80: the file and the JSON path must still be there, unbroken."""
    doc = copy.deepcopy(_doc())
    doc["tolerances"][0]["loss"]["atol"] = "x"
    file = _write(tmp_path, doc, "b.json")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    run = subprocess.run([sys.executable, "-m", "grpo_conform", "spec", "validate", file], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    joined = " ".join((run.stdout + run.stderr).split())
    assert f"{file}: $.tolerances[0].loss.atol: got \"x\", expected a value of type number" in joined
