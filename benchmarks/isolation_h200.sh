#!/usr/bin/env bash
# Issue 11 on the H200 (for the lead; run as root with the device tool): does the unprivileged
# worker (uid nobody, no capabilities, no_new_privs, own mount namespace, non-dumpable parent)
# still open the parent's CUDA tensors through CUDA IPC, and are the timings unchanged?
#   bash benchmarks/isolation_h200.sh
# Writes $OUT/isolation-*.txt: the CUDA IPC probe, then one triton check on seed-b2 as the worker
# user `nobody` (the default) and one as root (GRPO_CONFORM_WORKER_USER=root, the old behaviour).
# Compare the `worker.privileges` of the JSON reports and the medians of the two runs.
. "$(dirname "$0")/device_common.sh"
python3 benchmarks/isolation_probe.py > "$OUT/isolation-probe.txt" 2>&1
for user in nobody root; do
  GRPO_CONFORM_WORKER_USER=$user timeout -s KILL 900 python3 -m grpo_conform check implementations/triton \
    --workload seed-b2 --format json --no-evidence > "$OUT/isolation-check-$user.json" 2> "$OUT/isolation-check-$user.txt"
  echo "exit $?" >> "$OUT/isolation-check-$user.txt"
done
ls -la /dev/shm > "$OUT/isolation-dev-shm-after.txt"
