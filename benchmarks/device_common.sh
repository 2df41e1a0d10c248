# Sourced by benchmarks/h200_evidence.sh: installs the
# carried wheels (.whl/, see the device tool's README), puts them and the repo on PYTHONPATH, and
# sets $OUT (what comes back), $LOG and $R (the exploration log and its JSON results).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/explore.log; R=$OUT/explore.json
