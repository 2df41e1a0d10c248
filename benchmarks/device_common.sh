# Sourced by the device-tool scripts (benchmarks/device_*.sh, h200_evidence.sh): installs the
# carried wheels (.whl/, see the device tool's README), puts them and the repo on PYTHONPATH, and
# sets $OUT (what comes back), $LOG and $R (the exploration log and its JSON results).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/explore.log; R=$OUT/explore.json

# Kernel variants whose programs wait for each other, one process each: a deadlock costs only
# its timeout. Usage: explore_variants SECONDS VARIANT...
explore_variants() {
  local limit=$1; shift
  for v in "$@"; do
    timeout -s KILL "$limit" python3 benchmarks/explore_triton.py --variant "$v" --out "$R" 2>&1 | tee -a "$LOG" \
      || echo "variant $v ended with status $?" | tee -a "$LOG"
  done
}
