# Sourced by benchmarks/h200_evidence.sh: installs the
# carried wheels (.whl/, see the device tool's README), puts them and the repo on PYTHONPATH, and
# sets $OUT (what comes back), $LOG and $R (the exploration log and its JSON results).
# $OUT is the device's folder that comes back; a child shell sees it only if exported. A part that wrote elsewhere
# spent its device time for nothing (forty-fifth session: a first run's records lost), so stop before any of it.
if [ -z "${OUT:-}" ] && [ -z "${LOCAL_OUT:-}" ]; then
  echo "device_common.sh: OUT is not set: 'export OUT' before running a part (or set LOCAL_OUT=DIR off the device)" >&2
  exit 2
fi
OUT=${OUT:-$LOCAL_OUT}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
LOG=$OUT/explore.log; R=$OUT/explore.json
# The device image sets PYTHONDONTWRITEBYTECODE=1 and ships torch, sympy and numpy without bytecode, so every
# worker compiled ~1,340 modules from source at its start (2.3 s of CPU each; docs/timing.md, "Fourteenth
# session"); a pip-installed torch has its bytecode. Once per machine: the modules a worker imports, compiled.
if [ ! -e /tmp/.grpo-conform-bytecode ]; then
  python3 - <<'PY' && touch /tmp/.grpo-conform-bytecode
import py_compile, sys
import torch, torch.fx.experimental.symbolic_shapes, triton, numpy  # what a worker imports before `load`
import grpo_conform.isolation.worker, grpo_conform.check  # and the validator's own
for m in list(sys.modules.values()):
    f = getattr(m, "__file__", None) or ""
    if f.endswith(".py"):
        try:
            py_compile.compile(f, doraise=True)
        except Exception:
            pass  # an unwritable folder: that module compiles at import, as before
PY
fi
