#!/usr/bin/env bash
# Device call: does the parent's missing synchronize before a request explain the input-layouts
# failures of 2026-12-01 (Triton and Liger at seed-b8/b16)? The same check without the
# synchronize (a patched copy of the tree) and with it, then the CUDA gallery folders.
set -u
. benchmarks/device_common.sh
R=$OUT/reports; mkdir -p "$R"
export GRPO_CONFORM_GIT_COMMIT=${GRPO_CONFORM_GIT_COMMIT:-unknown}
summ() {  # FILE: one line per failed check
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for im in d["implementations"]:
    for m in im.get("members") or [im]:
        for w in m["workloads"]:
            bad = [f"{c['check']}: {c['message'][:160]}" for c in w["checks"] if c["status"] == "fail"]
            print(im["name"], w["workload"], "FAILED" if bad else "ok", *bad, sep=" | ")
PY
}
rm -rf /tmp/old && cp -r . /tmp/old
python3 - <<'PY'
p = "/tmp/old/grpo_conform/isolation/session.py"
s = open(p).read()
a = s.index('        if self.device.type == "cuda":\n            # The parent\'s writes')
b = s.index("torch.cuda.synchronize(self.device)\n", a) + len("torch.cuda.synchronize(self.device)\n")
open(p, "w").write(s[:a] + s[b:])
PY
grep -c "synchronize(self.device)" /tmp/old/grpo_conform/isolation/session.py
for round in 1; do
  (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout -s KILL 150 python3 -m grpo_conform check implementations/triton \
     --member token-is --workload seed-b8 --workload seed-b16 --no-timing --no-evidence --format json \
     > "$R/old-triton-$round.json" 2> "$R/old-triton-$round.log"); echo "old (no sync) triton round $round: exit $?"
  summ "$R/old-triton-$round.json"
done
timeout -s KILL 150 python3 -m grpo_conform check implementations/triton --member token-is --workload seed-b8 \
  --workload seed-b16 --no-timing --no-evidence --format json > "$R/new-triton.json" 2> "$R/new-triton.log"
echo "new (sync) triton: exit $?"; summ "$R/new-triton.json"
timeout -s KILL 120 python3 -m grpo_conform check implementations/liger --member token-is --workload seed-b16 \
  --workload seed-b2 --no-timing --no-evidence --format json > "$R/new-liger.json" 2> "$R/new-liger.log"
echo "new (sync) liger: exit $?"; summ "$R/new-liger.json"
timeout -s KILL 120 python3 -m grpo_conform check tests/gallery/int32-offsets --workload seed-b17-big --no-timing \
  --no-evidence --format json > "$R/gallery-int32.json" 2> "$R/gallery-int32.log"
echo "gallery int32-offsets (must fail gradient): exit $?"; summ "$R/gallery-int32.json"
timeout -s KILL 200 python3 -m grpo_conform check tests/gallery/forward-skips-logits tests/gallery/full-skips-gradient \
  tests/gallery/side-stream tests/gallery/cached-timing tests/gallery/correct-then-lazy \
  --workload seed-b2 --no-evidence --format json > "$R/gallery.json" 2> "$R/gallery.log"
echo "gallery timed: exit $?"; summ "$R/gallery.json"
tail -5 "$R/gallery.log"
