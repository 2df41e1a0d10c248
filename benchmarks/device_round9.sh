#!/usr/bin/env bash
# Device call, round 9 (one H200, ~3 minutes): where the host time of a launch-bound call goes
# (benchmarks/host_overhead_probe.py), then benchmarks/kernel_v3.py with the validator's adaptive
# pre-start spin: seed batches 2/8/16 (token-is deferred to backward), the masked members at
# batch 8, and the backward grid shapes (work: d loss alternating; none: d loss = 1 predicted).
#   run: bash benchmarks/device_round9.sh          (carry .whl/ as for the other device scripts)
set -u
. benchmarks/device_common.sh
timeout -s KILL 90 python3 benchmarks/host_overhead_probe.py > "$OUT/host-probe.txt" 2>&1
echo "host probe: exit $?"; grep -E " us$|count" "$OUT/host-probe.txt" | head -30
timeout -s KILL 330 python3 benchmarks/kernel_v3.py --no-liger --only seed,members,tuning --batches 2,8,16 \
  --tunings 4096:4:16,4096:4:32,2048:4:32,8192:8:16 2>&1 | tee "$OUT/kernel_v3.log" | grep -v '^{'
echo "kernel_v3: exit ${PIPESTATUS[0]}"
grep '^{' "$OUT/kernel_v3.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'ms' in r:
        print(r['kind'], r.get('member', ''), 'b%s' % r.get('batch', ''), 'c=%s' % r.get('c', ''),
              r.get('grad_chunk', ''), r.get('grad_warps', ''), r.get('programs_per_sm', ''),
              '%.4f ms %.3fx' % (r['ms'], r.get('ratio', 0)))"
