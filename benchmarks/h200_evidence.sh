#!/usr/bin/env bash
# The device runs (device tool, one H200), in parts that each fit one 10-minute device call. From a checkout
# holding `.whl/` (carry it), with benchmarks/results moved aside (benchmarks/results/README.md) and
# GRPO_CONFORM_GIT_COMMIT set to the commit the tree travelled from (the tree has no .git there), and `export OUT`
# first: the device shell may not export it (forty-fifth session: a first run's records were written under a fallback
# /tmp/out and lost); device_common.sh now stops at once without it:
#
# Checks and records
#   bash benchmarks/h200_evidence.sh probe      # worker isolation on CUDA + the CUDA kernel tests
#   bash benchmarks/h200_evidence.sh sandbox    # --sandbox bwrap on CUDA: triton passes, escapes-sandbox is stopped
#                                               # (carry .debs/ holding bubblewrap_*.deb: no bwrap, no network there)
#   bash benchmarks/h200_evidence.sh ahead35c   # the default check of triton on first runs (compile stores cleared),
#                                               # phases; VARIANTS="THREADS:SHAPES ..." (default "0:batch1 8:batch1
#                                               # 8:workload"); the first variant writes every member's records.
#                                               # Twenty-third session: VARIANTS="0:batch1" DEADLINE=200, 156 s
#   DEADLINE=200 bash benchmarks/h200_evidence.sh peers36   # Liger's and PyTorch's records at the members'
#                                               # current spec identities (mask-b8, seed-b8), one after the other
#   bash benchmarks/h200_evidence.sh round26b   # re-recording triton-fused after a change, in three parts of ~6-7
#   bash benchmarks/h200_evidence.sh round21b   # min each: every fused member at seed-b2..b16
#   bash benchmarks/h200_evidence.sh round21c
#   MEMBERS="..." DEADLINE=505 bash benchmarks/h200_evidence.sh round32t   # the same in one call where it fits:
#                                               # the staged sweep's CUDA tests, then MEMBERS at seed-b2..b16;
#                                               # round32s first runs fused_bench at b2
# Measurements (no records unless said)
#   bash benchmarks/h200_evidence.sh round32x   # issue 32: fused_profile b2/b4, then the three fused cells that
#                                               # round32t-w left untimed (records; all timed since the 23rd session)
#   MEMBERS="..." bash benchmarks/h200_evidence.sh round32z   # issue 32, 24th session: the epilogue forward's CUDA
#                                               # tests, gemm_operands, the profile; then MEMBERS' records
#                                               # (CHECK_ONLY=1: the records alone)
#   bash benchmarks/h200_evidence.sh round32aa  # issue 32, next (~8 min): the nine members' records at seed-b2/b4
#                                               # and token-is at seed-b16 under the layout ceiling, the epilogue
#                                               # kernel's row-block groups at b2/b4 (round32y ran in the 24th and
#                                               # 25th sessions' calls and is in git history)
#   bash benchmarks/h200_evidence.sh round35c   # the default check of triton with records, then three fused cells (~7 min)
#   B16_MEMBERS="..." bash benchmarks/h200_evidence.sh once32   # compile ahead without/with the once-per-member
#                                               # calls' proxies (first runs, 8 members, no timing), then fused b16 records
#   ALT="12 4" bash benchmarks/h200_evidence.sh mem35   # another grant estimate against HEAD's: first runs, no timing
#   bash benchmarks/h200_evidence.sh s39        # this session's draws on CUDA: triton's default check with records,
#                                               # triton-fused's masked members at seed-b2, the sweep (H200)
#   bash benchmarks/h200_evidence.sh s43        # reach's calls timed (four members, first run), fused_bench b2-b16, the sweep
#   RECORDS_ANY=1 bash benchmarks/h200_evidence.sh s43b  # fused_bench b16 chunk x split (two members), then triton's default check
#   bash benchmarks/h200_evidence.sh s43c       # reach on CUDA sampled (slots) and profiled (workers), two members
#   bash benchmarks/h200_evidence.sh s46        # reach's audible calls on CUDA (any card, no records): triton and
#                                               # triton-fused -k reach, then the half-rows gallery folder
#   bash benchmarks/h200_evidence.sh s47        # issue 36's sweep with the least calls (any card, no records)
#   bash benchmarks/h200_evidence.sh s48        # pending/fold-loss applied on the device: CUDA tests, the sweep with
#                                               # the finalize launch and with the fold (any card, no records)
#   bash benchmarks/h200_evidence.sh s44        # the default check of triton with records (any card), a first run
#                                               # (forty-fifth session, H100, f94a5ba: 436 s; its files lost, see above)
#   bash benchmarks/h200_evidence.sh s36a       # pending/h-norm36 on an H200: triton's records, then the sweep in what is left
#   bash benchmarks/h200_evidence.sh z38c       # the worker's rewrite race and the lost-context stop, on CUDA
#   bash benchmarks/h200_evidence.sh z38        # the same fault narrowed: in process, -k zero-advantage, compute-sanitizer; then s36a
#   bash benchmarks/h200_evidence.sh z37        # the float16 zero-advantage crash on CUDA (synchronous launches), then s36a
#   bash benchmarks/h200_evidence.sh nt36       # the near-ties check on CUDA (both operations, the fused gallery folder), then s36a
#   bash benchmarks/h200_evidence.sh s34        # an H200: triton-fused records (MEMBERS); an H100: mem35's HEAD run
#   bash benchmarks/h200_evidence.sh s34b       # reach's peaks on CUDA; the launch-bound members' host profile (PROBE=0: not)
#   bash benchmarks/h200_evidence.sh sweep36    # issue 36: benchmarks/sweep_logits.py --configs (~7 min)
#   bash benchmarks/h200_evidence.sh sweep36b   # the staged HEAD path's CUDA tests at V 50257, the sweep at V 32000
#                                               # and 50257 (+ 128256 b8) with --configs there
#   bash benchmarks/h200_evidence.sh sweep36c   # issue 36 (run 2026-12-05, 25 s): --configs at V 32000 in bf16 and fp16 over token-is,
#                                               # the masked token member and GSPO (the rules V 32000 still lacks)
#   bash benchmarks/h200_evidence.sh round35a   # the default check with GRPO_CONFORM_SAMPLE (each slot's time by
#                                               # function) and the GPU's memory sampled
#   bash benchmarks/h200_evidence.sh round35b   # the default check with every worker under cProfile
#   RUNS="cold warm" bash benchmarks/h200_evidence.sh round32a   # the default check twice (empty, then kept
#                                               # compile stores), the GPU's used memory sampled; JOBS6=1 adds --jobs 6
#
# `grpo-conform check` of each implementation writes unsigned records under $OUT/h200 (signed afterwards, off
# this machine, with `grpo-conform sign`); reports and logs under $OUT/reports; the part's output comes back
# as $OUT/h200-PART.tgz. The parts of earlier rounds (bench, small9, ours11 ... round25a, round27c, round29j,
# round30a, round31a, ahead35, ahead35b, slots35, round24v, ...; before them triton, peers, kernel, final,
# final9, final10) are in git history: each results folder under benchmarks/results names the commit it ran
# at, and `git show COMMIT:benchmarks/h200_evidence.sh` has the part as it ran (pruned in the twenty-third
# session, when 47 of its 64 parts had been superseded).
set -u
. benchmarks/device_common.sh
export GRPO_CONFORM_BUILDER_ID=${GRPO_CONFORM_BUILDER_ID:-device-tool:nvidia-h200}
mkdir -p "$OUT/h200" "$OUT/reports"
R=$OUT/reports
status() { echo "$*" | tee -a "$R/status.txt"; }

# The unprivileged worker must open the parent's CUDA tensors (CUDA IPC) on this machine; if it
# cannot, the run falls back to a worker of the validator's own user, and says so.
probe_user() {
  timeout -s KILL 150 python3 -m grpo_conform check tests/gallery/float64-eager --device cuda --workload small-bf16 \
    --no-timing --no-evidence > "$R/user-probe.txt" 2>&1
  local rc=$?
  status "worker as ${GRPO_CONFORM_WORKER_USER:-nobody}: float64-eager exit $rc"
  if [ $rc -ne 0 ]; then export GRPO_CONFORM_WORKER_USER=root; status "fallback: GRPO_CONFORM_WORKER_USER=root"; fi
}

default_check() {  # DEADLINE [records]: the default check of triton (every member, timing), phases and per-member
                  # seconds; with a second argument its records go to $OUT/h200 (signed afterwards, off the machine)
  local start=$SECONDS evidence=--no-evidence
  [ -n "${2:-}" ] && evidence="--evidence-dir $OUT/h200"
  timeout -s KILL $(($1 + 45)) python3 -m grpo_conform check implementations/triton $evidence --profile-phases \
    --deadline "$1" --format json > "$R/triton-default.json" 2> "$R/triton-default.log"
  status "triton default check (--deadline $1): exit $?, $((SECONDS - start)) s wall"
  grep -E "^  (judge|worker|reference|inputs|input-checks|timing|other|worker-start) " "$R/triton-default.log"
  python3 benchmarks/phase_summary.py "$R/triton-default.json"
}

check_one() {  # NAME LIMIT ARGS...
  # --deadline leaves 70 s under the kill for the last workload and the records (a killed run writes none)
  local name=$1 limit=$2; shift 2
  local deadline=$(( limit > 110 ? limit - 70 : limit * 2 / 5 ))
  timeout -s KILL "$limit" python3 -m grpo_conform check "implementations/$name" --evidence-dir "$OUT/h200" \
    --deadline "$deadline" --format json "$@" > "$R/$name.json" 2> "$R/$name.log"
  status "$name: exit $? ($*)"
}

case "${1:-probe}" in
  probe)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    probe_user
    timeout -s KILL 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_cuda.py > "$R/cuda-tests.txt" 2>&1
    status "cuda tests: exit $?"; tail -3 "$R/cuda-tests.txt"
    GRPO_CONFORM_WORKER_USER=${GRPO_CONFORM_WORKER_USER:-nobody} timeout -s KILL 200 python3 -m grpo_conform check \
      tests/gallery/int32-offsets tests/gallery/forward-skips-logits tests/gallery/full-skips-gradient \
      --no-evidence --format json > "$R/gallery-cuda-new.json" 2> "$R/gallery-cuda-new.log"
    status "gallery (int32-offsets, forward-skips-logits, full-skips-gradient): exit $?"
    ;;
  round26b)  # eighth session (run inline then, the same command): round21a's three members at seed-b2..b16 without its
              # fused_bench (341 s at 4a8410f); then round21b and round21c (408 s and 360 s) re-record the other six
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    check_one triton-fused 430 --member token-is --member token-is-bias --member token-offpolicy-mask \
      --workload seed-b2 --workload seed-b4 --workload seed-b8 --workload seed-b16 --profile-phases
    ;;
  round35a)  # next session, first (issue 35): the CUDA tests of the fourteenth session's unmeasured code (the
              # judge's row floors from the float64 log-probs kernel, the comparison's divisions), then the
              # default check with GRPO_CONFORM_SAMPLE (grpo_conform/sampler.py: where each slot's time goes) and
              # the GPU's memory and utilisation sampled (~5 min; move benchmarks/results aside first: its README)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    timeout 300 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_reference_kernel.py tests/test_compare_fused.py \
      tests/test_row_judge.py -k "cuda or compiled" > "$R/cuda-tests.txt" 2>&1
    status "CUDA tests: $(tail -1 "$R/cuda-tests.txt")"
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 200 > "$R/memory-used.csv" &
    sampler=$!
    export GRPO_CONFORM_SAMPLE="$R/samples"  # every slot's sample-PID.txt (grpo_conform/sampler.py)
    default_check "${DEADLINE:-300}"
    unset GRPO_CONFORM_SAMPLE
    kill $sampler
    ;;
  round35b)  # fifteenth session (issue 35): where a fresh turn worker's time goes. The CUDA row-floor test, then the
              # default check with every worker under cProfile (GRPO_CONFORM_WORKER_PROFILE; the profiles and the
              # compile store's entries summarised by PROF_SUMMARY, a helper carried in .whl/, not kept in the tree)
    timeout 200 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_reference_kernel.py -k cuda > "$R/cuda-tests.txt" 2>&1
    status "CUDA tests: $(tail -1 "$R/cuda-tests.txt")"
    mkdir -m 777 -p /wprof  # writable by the workers' user, and not a place they get a private copy of
    export GRPO_CONFORM_WORKER_PROFILE=/wprof
    default_check "${DEADLINE:-330}"
    unset GRPO_CONFORM_WORKER_PROFILE
    [ -n "${PROF_SUMMARY:-}" ] && python3 "$PROF_SUMMARY" /wprof "${HOME}/.cache/grpo-conform" > "$R/profiles.txt" 2>&1
    ;;
  round32a)  # twelfth session (issue 35): the default check with its slots sharing the GPU (gate/gpu_share.py:
              # --jobs auto = 4 on the H200's 16 cores), twice (the second run starts from the compile stores the
              # first left), the GPU's used memory sampled every 200 ms; then --jobs 6 once
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 200 > "$R/memory-used.csv" &
    sampler=$!
    for run in ${RUNS:-cold warm}; do
      default_check "${DEADLINE:-240}"
      mv "$R/triton-default.json" "$R/triton-default-$run.json"; mv "$R/triton-default.log" "$R/triton-default-$run.log"
      status "$run: GPU memory used at most $(sort -n "$R/memory-used.csv" | cut -d, -f2 | sort -n | tail -1) MiB so far"
    done
    if [ -n "${JOBS6:-}" ]; then
      GRPO_CONFORM_JOBS=6 default_check "${DEADLINE:-240}"
      mv "$R/triton-default.json" "$R/triton-default-jobs6.json"; mv "$R/triton-default.log" "$R/triton-default-jobs6.log"
    fi
    kill $sampler
    status "GPU memory used at most $(cut -d, -f2 "$R/memory-used.csv" | sort -n | tail -1) MiB"
    ;;
  round32s)  # issue 32, twenty-first session: the staged forward sweep of triton-fused (sweep.py; a new folder identity):
             # fused_bench at b2 (the staged default against the pipelined sweep, compose, the logits GEMM; forward and
             # full), then round32t: the sweep's CUDA tests and the fused members at seed-b2..b16 with records, as far
             # as DEADLINE goes (default 330 s; MEMBERS picks members, default all nine; ~50-60 s of timing a member).
    timeout -s KILL 100 python3 benchmarks/fused_bench.py --batches 2 --chunks 2048 --strategies auto --split 0 --no-liger \
      --reps 10 --extra weight_grad=auto weight_grad=auto,forward_sweep=pipelined --out "$R/fb32s.json" > "$R/fb32s.log" 2>&1
    status "fused_bench b2 (staged default, pipelined): exit $?"
    grep -E "^\| 2 \| (full|forward) \||check" "$R/fb32s.log"
    ;&
  round32t)
    timeout -s KILL 60 python3 -m pytest -q -p no:cacheprovider tests/test_triton_fused_staged.py > "$R/staged-tests.txt" 2>&1
    status "staged sweep tests (CUDA): exit $?"; tail -2 "$R/staged-tests.txt"
    margs=()
    for m in ${MEMBERS:-token-is token-is-bias token-offpolicy-mask token-offpolicy-mask-kl token-offpolicy-mask-kl-ref-weight bnpo-mask dr-grpo-mask dapo-mask sequence-offpolicy-mask}; do
      margs+=(--member "$m")
    done
    start=$SECONDS
    # the timing of a fused seed workload (b2 ~5 s, b16 ~29 s; round 26) waits until every slot's conformance is done:
    # a deadline that comes first leaves records without timings, so DEADLINE must cover both
    timeout -s KILL $((${DEADLINE:-330} + 50)) python3 -m grpo_conform check implementations/triton-fused "${margs[@]}" \
      --workload seed-b2 --workload seed-b4 --workload seed-b8 --workload seed-b16 --evidence-dir "$OUT/h200" \
      --deadline "${DEADLINE:-330}" --profile-phases --format json > "$R/triton-fused.json" 2> "$R/triton-fused.log"
    status "triton-fused seed-b2..b16 (${MEMBERS:-all nine}): exit $?, $((SECONDS - start)) s wall"
    tail -4 "$R/triton-fused.log"
    python3 benchmarks/phase_summary.py "$R/triton-fused.json" 2>&1 | cut -c1-300
    ls "$OUT/h200" | wc -l
    ;;
  round32x)  # issue 32, next: where the b2 forward's 0.2 ms over the GEMM goes (benchmarks/fused_profile.py: kernel
             # durations and the GPU's idle gaps inside a call, ours staged and pipelined, compose, the bare GEMM;
             # ~1 min), then the three fused cells round32t-w left untimed, at the same folder identity (~4 min); their
             # phases are the first H200 measure of the one-row-pass reference (docs/fused-kernel.md, "One row pass
             # per input set": the judge's share, against round32t's 615 of the slots' seconds)
    timeout -s KILL 150 python3 benchmarks/fused_profile.py --batches 2 4 --reps 10 --out "$R/fused-profile.json" \
      > "$R/fused-profile.log" 2>&1
    status "fused_profile b2 b4: exit $?"; cat "$R/fused-profile.log" | cut -c1-200
    for cell in "token-is-bias --workload seed-b16" "token-offpolicy-mask-kl-ref-weight --workload seed-b2 --workload seed-b4"; do
      start=$SECONDS
      tag=${cell%% *}
      timeout -s KILL 200 python3 -m grpo_conform check implementations/triton-fused --member $cell \
        --evidence-dir "$OUT/h200" --deadline 170 --profile-phases --format json > "$R/triton-fused-$tag.json" \
        2> "$R/triton-fused-$tag.log"
      status "triton-fused $cell: exit $?, $((SECONDS - start)) s wall"
      tail -2 "$R/triton-fused-$tag.log"
    done
    ls "$OUT/h200" | wc -l
    ;;
  peers36)  # the peers' records at the members' current spec identities (the leaderboard's tables for the masked
            # members hold no peer: theirs are of superseded spec identities). Liger and PyTorch eager at mask-b8
            # (token-is: seed-b8), every member each declares, timed, records under $OUT/h200; DEADLINE (420 s)
    for impl in ${IMPLS:-liger pytorch}; do
      start=$SECONDS
      timeout -s KILL $((${DEADLINE:-420} + 60)) python3 -m grpo_conform check "implementations/$impl" --workload mask-b8 \
        --workload seed-b8 --evidence-dir "$OUT/h200" --deadline "${DEADLINE:-420}" --format json \
        > "$R/$impl-peers.json" 2> "$R/$impl-peers.log"
      status "$impl at mask-b8 / seed-b8, every member: exit $?, $((SECONDS - start)) s wall"
      tail -2 "$R/$impl-peers.log"
    done
    ls "$OUT/h200" | wc -l
    ;;
  ahead35c)  # issue 35, eighteenth session: the three compile-ahead settings in one call, each on a first run
             # (the compile stores cleared before each), ~8 min: VARIANTS="THREADS:SHAPES ...", default
             # "0:batch1 8:batch1 8:workload" (the default check; side by side on 8 threads; and at the workloads'
             # own shapes). The compile-only CUDA test first when a variant has threads.
    variants=${VARIANTS:-0:batch1 8:batch1 8:workload}
    case " $variants" in *" "[1-9]*)
      timeout -s KILL 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_compile_only_cuda.py > "$R/compile-only-test.txt" 2>&1
      status "compile_only CUDA test: exit $?"; tail -1 "$R/compile-only-test.txt" ;;
    esac
    records=records  # the first variant's check writes every member's records at the folder's current identity:
                     # the leaderboard has cells for token-is only at it (eighteenth session's contents table)
    for v in $variants; do
      export GRPO_CONFORM_COMPILE_AHEAD_THREADS=${v%%:*} GRPO_CONFORM_COMPILE_AHEAD_SHAPES=${v#*:}
      rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
      status "variant threads ${v%%:*}, shapes ${v#*:}, empty compile stores${records:+, records written}"
      default_check "${DEADLINE:-230}" $records
      records=
      tag=cold-t${v%%:*}-${v#*:}
      mv "$R/triton-default.json" "$R/triton-default-$tag.json"; mv "$R/triton-default.log" "$R/triton-default-$tag.log"
      python3 - "$R/triton-default-$tag.json" <<'PY' 2>&1 | cut -c1-400  # each slot's worker.compile_ahead, wherever it sits
import json, sys
def walk(x):
    if isinstance(x, dict):
        if "compile_ahead" in x:
            yield x["compile_ahead"]
        for v in x.values():
            yield from walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from walk(v)
for found in walk(json.load(open(sys.argv[1]))):
    print("compile_ahead:", json.dumps(found))
PY
    done
    ;;
  round21b)  # 2 of 3 (~400 s estimated: 121 + 162 + 117)
    check_one triton-fused 520 --member token-offpolicy-mask-kl --member token-offpolicy-mask-kl-ref-weight \
      --member bnpo-mask --workload seed-b2 --workload seed-b4 --workload seed-b8 --workload seed-b16 --profile-phases
    ;;
  round21c)  # 3 of 3 (~360 s estimated: 117 + 117 + 122)
    check_one triton-fused 480 --member dr-grpo-mask --member dapo-mask --member sequence-offpolicy-mask \
      --workload seed-b2 --workload seed-b4 --workload seed-b8 --workload seed-b16 --profile-phases
    ;;
  sweep36)  # issue 36: the shape sweep and the launch configurations compared; the sweep keeps a 370 s budget
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    timeout -s KILL 450 python3 benchmarks/sweep_logits.py --configs --out "$R/sweep.json" > "$R/sweep.log" 2>&1
    status "sweep_logits --configs: exit $?"; tail -c 9000 "$R/sweep.log"
    ;;
  sweep36b)  # issue 36 after the staged HEAD path (implementations/triton/staged_rows.py; docs/triton-kernel-notes.md,
             # "Rows off 16-byte boundaries"): first its CUDA tests at V 50257 (HEAD against the plain kernels and the
             # reference), then the sweep cut to V 32000 and 50257 plus the seed vocabulary at batch 8 as control, with
             # --configs at 32000 (launch candidates) and 50257 (shipped = the split against "no-head", the launch before it)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    timeout -s KILL 100 python3 -m pytest -q -p no:cacheprovider tests/test_triton_cuda.py \
      -k "head_path and 50257 or neither" > "$R/cuda-tests.txt" 2>&1
    status "CUDA tests, HEAD path at V 50257: exit $? (0: passed)"; tail -5 "$R/cuda-tests.txt"
    timeout -s KILL 240 python3 benchmarks/sweep_logits.py --configs --vocab 32000,50257 --control 128256:8 \
      --configs-vocab 32000,50257 --no-launch --budget-s 200 --out "$R/sweep.json" > "$R/sweep.log" 2>&1
    status "sweep_logits V 32000/50257 (+128256 b8) --configs: exit $?"; tail -c 9000 "$R/sweep.log"
    ;;
  round32aa)  # issue 32, next (~8 min, one call): the records the twenty-fifth session lost (the nine members at
             # seed-b2/b4, identity 43438ef9fd6a) and token-is at seed-b16 again, both under the ceiling that times
             # each GEMM in its fastest layout (whole or in chunks of rows: docs/floors.md, section 4); then the
             # epilogue kernel's row-block groups at b2/b4 (b8/b16 ran in the twenty-fifth session)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    nine=(); for m in token-is token-is-bias token-offpolicy-mask token-offpolicy-mask-kl \
        token-offpolicy-mask-kl-ref-weight bnpo-mask dr-grpo-mask dapo-mask sequence-offpolicy-mask; do nine+=(--member "$m"); done
    start=$SECONDS
    timeout -s KILL 350 python3 -m grpo_conform check implementations/triton-fused "${nine[@]}" --workload seed-b2 \
      --workload seed-b4 --evidence-dir "$OUT/h200" --deadline 300 --profile-phases --format json \
      > "$R/fused-b2b4.json" 2> "$R/fused-b2b4.log"
    status "triton-fused seed-b2/b4, nine members: exit $?, $((SECONDS - start)) s wall"; tail -2 "$R/fused-b2b4.log"
    start=$SECONDS
    timeout -s KILL 170 python3 -m grpo_conform check implementations/triton-fused --member token-is --workload seed-b16 \
      --evidence-dir "$OUT/h200" --deadline 130 --format json > "$R/fused-b16.json" 2> "$R/fused-b16.log"
    status "triton-fused token-is seed-b16: exit $?, $((SECONDS - start)) s wall"; tail -2 "$R/fused-b16.log"
    python3 - "$R/fused-b2b4.json" "$R/fused-b16.json" <<'PY' | tee -a "$R/status.txt"
import json, sys
for path in sys.argv[1:]:  # each timed cell's ratio and the ceiling's layout per GEMM (gemm_ceiling.layouts: alone)
    try:
        report = json.load(open(path))
    except (OSError, ValueError):
        continue
    for impl in report.get("implementations", []):
        for m in impl.get("members", []):
            for w in m.get("workloads", []):
                for t in w.get("timings", []):
                    c = t.get("gemm_ceiling") or {}
                    print((m.get("spec") or {}).get("id"), w.get("workload"), t.get("protocol"),
                          round(t["event"]["median_ns"] / 1e6, 3), "ms", t.get("gemm_ceiling_ratio"), c.get("layout"),
                          c.get("layouts"))
PY
    ls "$OUT/h200" | wc -l
    timeout -s KILL 100 python3 benchmarks/research/epilogue_gemm.py --batches 2 4 --only-tma --tma-configs 2 \
      --group-m 4 8 16 32 --out "$R/epilogue-groups.json" > "$R/epilogue-groups.log" 2>&1
    status "epilogue_gemm b2 b4 groups: exit $?"; grep "^b" "$R/epilogue-groups.log"
    ;;
  round35e)  # thirty-first session: the caching check's same-set comparison on the two masked members whose
             # mask-b8 it judged (ours and PyTorch eager, records); round32z after it in the same command
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    start=$SECONDS
    timeout -s KILL 200 python3 -m grpo_conform check implementations/triton implementations/pytorch \
      --member sequence-offpolicy-mask --member token-offpolicy-mask --workload mask-b8 --evidence-dir "$OUT/h200" \
      --deadline 150 --profile-phases --format json > "$R/caching.json" 2> "$R/caching.log"
    status "caching at mask-b8 (triton, pytorch; two members): exit $?, $((SECONDS - start)) s wall"
    python3 - "$R/caching.json" <<'PY' | tee -a "$R/status.txt"
import json, sys
for impl in json.load(open(sys.argv[1]))["implementations"]:
    for m in impl["members"]:
        for w in m["workloads"]:
            for c in w["checks"]:
                if c["check"] == "caching":
                    for p in c["evidence"].get("protocols", []):
                        print(impl["name"], m["spec"]["member"], p["protocol"], p.get("set"), round(p["ratio"], 3),
                              p["identical_median_ns"], p["fresh_median_ns"], c["status"])
PY
    ;;
  round35d)  # thirty-first session (issue 35): round35c's default check on an H100 stopped making progress at 79 s
             # (killed at 285 s; token-is's seed-b17-big was the last workload started, 18.9 s in the 27th
             # session). Every process's stacks every 20 s (GRPO_CONFORM_SAMPLE / _WORKER_PROFILE): seed-b17-big
             # alone (one slot, untimed), then the default check, both killed with their stacks if they hang
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits -l 2 > "$R/memory-used.csv" &
    smi=$!
    mkdir -p "$R/stacks" "$R/wstacks" && chmod 777 "$R/wstacks"
    export GRPO_CONFORM_SAMPLE="$R/stacks" GRPO_CONFORM_WORKER_PROFILE="$R/wstacks"
    start=$SECONDS
    timeout -s KILL ${ALONE:-130} python3 -m grpo_conform check implementations/triton --member token-is \
      --workload seed-b17-big --no-timing --no-evidence --jobs 1 --profile-phases > "$R/b17.txt" 2>&1
    status "token-is seed-b17-big alone: exit $?, $((SECONDS - start)) s wall"; tail -4 "$R/b17.txt" | cut -c1-300
    pkill -KILL -f grpo_conform; sleep 2
    if [ "${DEFAULT:-1}" = 1 ]; then
      default_check "${DEADLINE:-200}"
    fi
    unset GRPO_CONFORM_SAMPLE GRPO_CONFORM_WORKER_PROFILE
    kill $smi
    ;;
  s39)  # thirty-ninth session (~9.5 min): this session's new draws on CUDA (the layouts set drawn live, small-|A| rows
        # judged on a live token, reach's float16 range) in the default check of triton with records (an H200: its
        # records; another card with RECORDS_ANY=1: that card's), then triton-fused's two masked members at seed-b2 with
        # every probe and no timing (the same draws through the fused operation), then the sweep in what is left (H200)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
    if grep -q H200 "$R/nvidia-smi.txt"; then default_check "${DEADLINE:-220}" records
    else default_check "${DEADLINE:-220}" ${RECORDS_ANY:+records}; fi
    timeout -s KILL 150 python3 -m grpo_conform check implementations/triton-fused --member token-offpolicy-mask \
      --member sequence-offpolicy-mask --workload seed-b2 --device cuda --no-timing --no-evidence --format json \
      > "$R/fused-b2.json" 2> "$R/fused-b2.log"
    status "triton-fused token-offpolicy-mask, sequence-offpolicy-mask at seed-b2, every probe, no timing: exit $?"
    tail -5 "$R/fused-b2.log"
    left=$(( ${CALL_S:-585} - SECONDS - 25 ))
    if grep -q H200 "$R/nvidia-smi.txt" && [ "$left" -gt 120 ]; then
      status "sweep: $left s left"
      timeout -s KILL "$left" python3 benchmarks/sweep_logits.py --budget-s $((left - 30)) --out "$R/sweep.json" \
        > "$R/sweep.log" 2>&1
      status "sweep_logits: exit $?"; tail -c 6000 "$R/sweep.log"
    fi
    ;;
  s43)  # forty-third session (~9 min, any card, no records): reach's calls timed one by one on a first run (four
        # members, -k reach, no timing: draws.reach[i].seconds), issue 32's fused_bench at b2-b16 (token-is: the three
        # GEMMs, eager, Liger, the composition, ours as shipped), then issue 36's sweep in what is left (Liger carried)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
    start=$SECONDS
    timeout -s KILL 170 python3 -m grpo_conform check implementations/triton --member token-is --member dapo-mask \
      --member token-offpolicy-mask-kl --member vllm-sequence-truncate -k reach --device cuda --no-timing \
      --no-evidence --format json > "$R/reach.json" 2> "$R/reach.log"
    status "triton -k reach, four members, first run: exit $?, $((SECONDS - start)) s"
    start=$SECONDS
    timeout -s KILL 260 python3 benchmarks/fused_bench.py --batches 2 4 8 16 --member token-is --chunks 2048 \
      --strategies auto --extra weight_grad=auto --out "$R/fused_bench.json" > "$R/fused_bench.log" 2>&1
    status "fused_bench token-is b2-b16: exit $?, $((SECONDS - start)) s"; tail -40 "$R/fused_bench.log"
    left=$(( ${CALL_S:-580} - SECONDS - 25 ))
    if [ "$left" -gt 90 ]; then
      status "sweep: $left s left"
      timeout -s KILL "$left" python3 benchmarks/sweep_logits.py --budget-s $((left - 30)) --out "$R/sweep.json" \
        > "$R/sweep.log" 2>&1
      status "sweep_logits: exit $?"; tail -c 5000 "$R/sweep.log"
    fi
    ;;
  s43b)  # forty-third session (~9.5 min, any card): issue 32's b16 lead (s43's fused_bench timed the 2048-row chunk
         # 4% under the shipped one at b16): halves at chunks 2048/4096 x split 0/16384 and the shipped auto, token-is
         # and bnpo, 10 reps; then the default check of triton with records in what is left (RECORDS_ANY: any card)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    for member in token-is bnpo; do
      timeout -s KILL 150 python3 benchmarks/fused_bench.py --batches 16 --member $member --chunks 2048 4096 \
        --strategies halves --split 0 16384 --extra weight_grad=auto --no-liger --reps 10 \
        --out "$R/fb16-$member.json" > "$R/fb16-$member.log" 2>&1
      status "fused_bench $member b16: exit $?"; grep "| 16 | full" "$R/fb16-$member.log"
    done
    rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
    if grep -q H200 "$R/nvidia-smi.txt" || [ -n "${RECORDS_ANY:-}" ]; then
      default_check $(( ${CALL_S:-570} - SECONDS - 60 )) records
    else default_check $(( ${CALL_S:-570} - SECONDS - 60 )); fi
    ;;
  s46)  # forty-sixth session (~8 min, any card): reach's audible calls (grpo_views.audible_call) on CUDA, no records:
         # triton's 20 members and triton-fused's 9 at tiny-bf16 with -k reach (honest: exit 0), then the gallery
         # folder fused-half-rows-dhidden-chunk-offset (must fail reach on CUDA too: its seq-aligned call, bfloat16)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
    for target in implementations/triton implementations/triton-fused tests/gallery/fused-half-rows-dhidden-chunk-offset; do
      left=$(( ${CALL_S:-570} - SECONDS - 30 ))
      [ "$left" -gt 60 ] || { status "$target: not run ($left s left)"; continue; }
      name=$(basename "$target"); start=$SECONDS
      extra=""; [ "$name" = triton ] || extra="--workload tiny-bf16"
      timeout -s KILL "$left" python3 -m grpo_conform check "$target" --device cuda -k reach $extra --no-evidence \
        --deadline $(( left - 40 )) --format json > "$R/$name-reach.json" 2> "$R/$name-reach.log"
      status "$name -k reach: exit $?, $((SECONDS - start)) s"
      grep -E "FAILED|passed \(" "$R/$name-reach.log" | tail -30
    done
    ;;
  s47)  # forty-seventh session (~5 min, any card, no records): issue 36's sweep with the least calls beside every
         # token-level row and the launch-bound call (benchmarks/sweep_least.py): which misses the least call of two
         # device operations shares on this card, and which are our kernel's own overhead
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    left=$(( ${CALL_S:-570} - SECONDS - 30 ))
    # SWEEP_ARGS: a part of the grid where the call is short (e.g. --vocab 32000,50257 --control 128256:1)
    timeout -s KILL "$left" python3 benchmarks/sweep_logits.py ${SWEEP_ARGS:-} --budget-s $((left - 40)) \
      --out "$R/sweep.json" > "$R/sweep.log" 2>&1
    status "sweep_logits with least calls: exit $?"; tail -c 7000 "$R/sweep.log"
    ;;
  s48)  # forty-eighth session (~8 min, any card, no records): the loss folded into the staged main kernel
         # (staged_terms._fold_loss, no finalize launch): its CUDA tests; then issue 36's sweep with the least calls
         # at V 32000/50257 (+ controls) with the finalize launch (GRPO_TRITON_FOLD_LOSS=0, what main ran before the
         # fold) and, where the tests passed, with the fold, both on this card in this call
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    if ! grep -q _fold_loss implementations/triton/staged_terms.py; then  # main keeps it pending (this copy only)
      (git apply pending/fold-loss/0001-fold-loss.patch 2>/dev/null || patch -p1 -s < pending/fold-loss/0001-fold-loss.patch) \
        || { status "s48: pending/fold-loss does not apply"; exit 1; }
      export GRPO_CONFORM_GIT_DIRTY=1
      status "s48: pending/fold-loss applied to this copy"
    fi
    timeout -s KILL 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_cuda.py \
      -k "${TESTS_K:-fold or staged_member_kernels_compiled}" > "$R/cuda-tests.log" 2>&1
    tests=$?
    status "CUDA tests (fold, staged members): exit $tests, $SECONDS s"; tail -n 15 "$R/cuda-tests.log"
    left=$(( ${CALL_S:-570} - SECONDS - 30 ))
    a=$(( tests == 0 ? (left * 2 / 3) : left ))
    # NOFOLD_ARGS / FOLD_ARGS: smaller grids where the call is short (e.g. "--vocab 32000" and "--vocab 32000 --no-liger")
    GRPO_TRITON_FOLD_LOSS=0 timeout -s KILL "$a" python3 benchmarks/sweep_logits.py \
      ${NOFOLD_ARGS:---vocab 32000,50257 --control 128256:1,151936:1} --budget-s $((a - 40)) --out "$R/sweep.json" \
      > "$R/sweep.log" 2>&1
    status "sweep_logits, finalize launch (GRPO_TRITON_FOLD_LOSS=0): exit $?, $SECONDS s"; tail -c 4000 "$R/sweep.log"
    left=$(( ${CALL_S:-570} - SECONDS - 20 ))
    if [ "$tests" = 0 ] && [ "$left" -gt 90 ]; then
      timeout -s KILL "$left" python3 benchmarks/sweep_logits.py ${FOLD_ARGS:---vocab 32000,50257 --no-liger} \
        --budget-s $((left - 30)) --out "$R/sweep-fold.json" > "$R/sweep-fold.log" 2>&1
      status "sweep_logits, the loss folded: exit $?, $SECONDS s"; tail -c 3000 "$R/sweep-fold.log"
    fi
    ;;
  s44)  # forty-fourth session (~6-9 min, any card): the default check of triton with records, a first run, after
         # fc500cb's cut of the validator's own reach cost (generator/reference kernel blocks, _unpeak vectorised)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
    default_check $(( ${CALL_S:-570} - SECONDS - 60 )) records
    ;;
  s43c)  # forty-third session (~4 min, any card, no records): where reach's ~1 s a call goes on CUDA. Two members,
         # -k reach, two slots, a first run: each slot's main thread sampled (GRPO_CONFORM_SAMPLE) and each worker
         # under cProfile (GRPO_CONFORM_WORKER_PROFILE), the profiles summarised by pstats into worker-profiles.txt
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
    mkdir -m 777 -p /wprof
    start=$SECONDS
    GRPO_CONFORM_SAMPLE="$R/samples" GRPO_CONFORM_WORKER_PROFILE=/wprof timeout -s KILL 200 python3 -m grpo_conform \
      check implementations/triton --member dapo-mask --member vllm-is-mask -k reach --device cuda --no-timing \
      --no-evidence --jobs 2 --format json > "$R/reach-prof.json" 2> "$R/reach-prof.log"
    status "triton -k reach, two members, sampled and profiled: exit $?, $((SECONDS - start)) s"
    python3 - /wprof > "$R/worker-profiles.txt" 2>&1 <<'PY'
import glob, io, pstats, sys
for f in sorted(glob.glob(sys.argv[1] + "/worker-*.prof")):
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(f, stream=out).sort_stats(key).print_stats(35)
        print(f"== {f} by {key}"); print(out.getvalue()[-9000:])
PY
    head -c 4000 "$R/worker-profiles.txt"
    ;;
  s36a)  # thirty-fifth session (~9.5 min): pending/h-norm36 applied (the tiled sequence kernels, the fp16 V 32000 rules).
         # An H200: the default check of triton with records (DEADLINE, default 220: its 20
         # members at the new folder identity), then the sweep (issue 36) in what is left. Another card: the same
         # without records (ONLY_H200=1: nothing)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    if [ ! -e implementations/triton/sequences.py ]; then
      status "s36a: pending/h-norm36 is not applied (git am it first)"
    elif grep -q H200 "$R/nvidia-smi.txt"; then  # the default check is the branch's CUDA test here
      rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
      default_check "${DEADLINE:-220}" records
      left=$(( ${CALL_S:-585} - SECONDS - 25 ))
      status "sweep: $left s left"
      if [ "$left" -gt 120 ]; then
        timeout -s KILL "$left" python3 benchmarks/sweep_logits.py --budget-s $((left - 30)) --out "$R/sweep.json" \
          > "$R/sweep.log" 2>&1
        status "sweep_logits: exit $?"; tail -c 6000 "$R/sweep.log"
      fi
    elif [ "${ONLY_H200:-0}" = 1 ]; then
      status "not an H200: nothing run (ONLY_H200=1)"
    else  # thirty-sixth session: the member tests passed on an H100 in the thirty-fifth; here the default check's
          # time on a first run (issue 35, no records) and the patched kernels' sweep in what is left (issue 36)
      rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
      default_check "${DEADLINE:-220}" ${RECORDS_ANY:+records}  # RECORDS_ANY=1: this card's records too (evidence/h100)
      left=$(( ${CALL_S:-585} - SECONDS - 25 ))
      status "sweep: $left s left"
      if [ "$left" -gt 120 ]; then
        timeout -s KILL "$left" python3 benchmarks/sweep_logits.py --budget-s $((left - 30)) --out "$R/sweep.json" \
          > "$R/sweep.log" 2>&1
        status "sweep_logits: exit $?"; tail -c 6000 "$R/sweep.log"
      fi
    fi
    ;;
  z38c)  # thirty-eighth session, the fixes on CUDA (~1.5 min): (1) rewritten-inputs and no-mutation on the two members
          # whose RW calls raced the parent's restore at 796a39f; (2) the float16 zero-advantage fault put back (this
          # copy only): the run must now stop after that workload with its report, exit 3, not a traceback
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    timeout -s KILL 150 python3 -m grpo_conform check implementations/triton --member sequence-offpolicy-mask \
      --member vllm-is-mask --workload mask-small-bf16 --device cuda --no-timing --no-evidence -k rewritten-inputs \
      -k no-mutation > "$R/z38c-rewrite.txt" 2>&1
    status "z38c (1) rewritten-inputs and no-mutation, two members: exit $?"; grep -E "rewritten-inputs|no-mutation|exit code" "$R/z38c-rewrite.txt" | head -8
    sed -i 's/^OTHER_DTYPES = other_dtypes.make_probe((L.EXACT_TIES,/OTHER_DTYPES = other_dtypes.make_probe((G.ZERO_ADVANTAGE, L.EXACT_TIES,/' \
      grpo_conform/checks/probes.py
    timeout -s KILL 100 python3 -m grpo_conform check implementations/triton --member dapo-mask --workload mask-small-bf16 \
      --workload mask-b1-long --device cuda --no-timing --no-evidence -k zero-advantage --format json \
      > "$R/z38c-lost.json" 2> "$R/z38c-lost.log"
    status "z38c (2) the lost CUDA context: exit $?"; grep -cE "^Traceback" "$R/z38c-lost.log" | sed 's/^/tracebacks: /'
    grep -E "CUDA context|NOT JUDGED" "$R/z38c-lost.log" | cut -c1-300 | head -4
    # (3) the same under compute-sanitizer, the validator's own process only (traced, the worker's load never
    # finished): a fault in one of its kernels is named there; none reported while the fault still comes means the
    # fault is not in a kernel the validator launched
    SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -n "$SAN" ]; then
      timeout -s KILL 150 "$SAN" --tool memcheck --target-processes application-only --print-limit 6 python3 -m grpo_conform \
        check implementations/triton --member dapo-mask --workload mask-small-bf16 --device cuda --no-timing \
        --no-evidence -k zero-advantage > "$R/z38c-san-slot.txt" 2>&1
      status "z38c (3) memcheck of the validator's process: exit $?"
      grep -E "^=========|NOT JUDGED|CUDA context" "$R/z38c-san-slot.txt" | cut -c1-240 | head -40
    fi
    git checkout -- grpo_conform/checks/probes.py 2>/dev/null || sed -i 's/make_probe((G.ZERO_ADVANTAGE, /make_probe((/' \
      grpo_conform/checks/probes.py
    ;;
  z38b)  # thirty-eighth session, after z38 (the validator faults in 10 s with -k zero-advantage, in the slot process;
          # the kernels alone in one process, and under memcheck, do not): where the first exception was raised
          # (the workload's draws.internal_error), with and without zero-advantage in other-dtypes
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    for variant in plain fp16; do
      [ "$variant" = fp16 ] && sed -i 's/^OTHER_DTYPES = other_dtypes.make_probe((L.EXACT_TIES,/OTHER_DTYPES = other_dtypes.make_probe((G.ZERO_ADVANTAGE, L.EXACT_TIES,/' \
        grpo_conform/checks/probes.py
      for member in dapo-mask token-offpolicy-mask-kl; do
        CUDA_LAUNCH_BLOCKING=1 timeout -s KILL 100 python3 -m grpo_conform check implementations/triton --member $member \
          --workload mask-small-bf16 --device cuda --no-timing --no-evidence -k zero-advantage --format json \
          > "$R/z38b-$variant-$member.json" 2> "$R/z38b-$variant-$member.log"
        status "z38b $variant $member: exit $?"
        python3 - "$R/z38b-$variant-$member.json" <<'PY' | tee -a "$R/status.txt"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no JSON:", e); sys.exit()
for r in d["implementations"]:
    for w in r["workloads"]:
        ie = (w.get("draws") or {}).get("internal_error")
        if ie:
            print("  internal_error:", ie.get("where"), ie.get("type"), ie.get("message", "")[:200])
            for f in ie.get("traceback", []):
                print("    ", f)
        for c in w["checks"]:
            print("  ", c["check"], c["status"], str(c.get("message"))[:160])
PY
      done
    done
    git checkout -- grpo_conform/checks/probes.py 2>/dev/null || sed -i 's/make_probe((G.ZERO_ADVANTAGE, /make_probe((/' \
      grpo_conform/checks/probes.py
    ;;
  z38)  # thirty-eighth session: the float16 zero-advantage fault narrowed (~2.5 min), then s36a in what is left (CALL_S).
         # (1) triton's kernels in this process, no validator: float16 [4, 13, 1536], zero advantages (one row, all),
         # upstream 1 and 0.37, under compute-sanitizer's memcheck; (2) the validator with zero-advantage back in
         # other-dtypes (this copy only), one member, `-k zero-advantage`, launches synchronous; (3) the same under
         # compute-sanitizer, every process. Which process faults, and in which kernel, is what this asks.
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    cat > /tmp/z38.py <<'PY'
import importlib, sys, types, torch
pkg = types.ModuleType("tri"); pkg.__path__ = ["implementations/triton"]; sys.modules["tri"] = pkg
grpo_loss = importlib.import_module("tri.impl").grpo_loss
dev = torch.device("cuda")
B, S, V = 4, 13, 1536
for dtype in (torch.float16, torch.bfloat16):
    for member, kw in (("dapo-mask", dict(loss_type="dapo")), ("kl", dict(beta=0.04))):
        for zero in ("one", "all"):
            for c in (1.0, 0.37, 1.0):
                g = torch.Generator(device="cpu").manual_seed(1)
                logits = (torch.randn(B, S + 1, V, generator=g) * 2).to(dtype).to(dev).requires_grad_()
                ids = torch.randint(0, V, (B, S), generator=g).to(dev)
                adv = torch.randn(B, generator=g).to(dev)
                if zero == "one": adv[1] = 0
                else: adv.zero_()
                old = (torch.randn(B, S, generator=g) * 0.1 - 8).to(dev)
                mask = (torch.rand(B, S, generator=g) < 0.8).to(dev).to(torch.int64)
                extra = dict(ref_logprobs=old + 0.05) if member == "kl" else {}
                loss = grpo_loss(logits, ids, adv, 0.2, 0.28, 0.7, old_logprobs=old, completion_mask=mask, **kw, **extra)
                (loss * c).backward()
                torch.cuda.synchronize()
                print(dtype, member, zero, c, float(loss), bool(torch.isfinite(logits.grad).all()), flush=True)
print("in-process: no fault")
PY
    timeout -s KILL 60 python3 /tmp/z38.py > "$R/z38-inproc.txt" 2>&1
    status "z38 (1) in process: exit $?"; tail -4 "$R/z38-inproc.txt"
    if [ -n "$SAN" ]; then
      timeout -s KILL 90 "$SAN" --tool memcheck --print-limit 8 python3 /tmp/z38.py > "$R/z38-inproc-san.txt" 2>&1
      status "z38 (1) in process under compute-sanitizer: exit $?"; grep -m 30 -E "Invalid|ERROR SUMMARY|at 0x|of size|Address|in process|no fault" "$R/z38-inproc-san.txt"
    else
      status "z38: no compute-sanitizer on this image"
    fi
    sed -i 's/^OTHER_DTYPES = other_dtypes.make_probe((L.EXACT_TIES,/OTHER_DTYPES = other_dtypes.make_probe((G.ZERO_ADVANTAGE, L.EXACT_TIES,/' \
      grpo_conform/checks/probes.py
    grep -c "make_probe((G.ZERO_ADVANTAGE" grpo_conform/checks/probes.py | sed 's/^/zero-advantage back in other-dtypes: /' | tee -a "$R/status.txt"
    CUDA_LAUNCH_BLOCKING=1 PYTHONFAULTHANDLER=1 timeout -s KILL 100 python3 -m grpo_conform check implementations/triton \
      --member dapo-mask --workload mask-small-bf16 --device cuda --no-timing --no-evidence -k zero-advantage \
      > "$R/z38-check.txt" 2>&1
    status "z38 (2) the validator, -k zero-advantage, synchronous: exit $?"
    grep -m 12 -E "illegal|Error|zero-advantage|conformant|FAILED" "$R/z38-check.txt"
    if [ -n "$SAN" ]; then
      GRPO_CONFORM_WORKER_USER=root timeout -s KILL 150 "$SAN" --tool memcheck --target-processes all --print-limit 8 \
        python3 -m grpo_conform check implementations/triton --member dapo-mask --workload mask-small-bf16 --device cuda \
        --no-timing --no-evidence -k zero-advantage > "$R/z38-check-san.txt" 2>&1
      status "z38 (3) the validator under compute-sanitizer: exit $?"
      grep -m 40 -E "Invalid|ERROR SUMMARY|at 0x|of size|Address|illegal|Saved host backtrace|Program hit" "$R/z38-check-san.txt"
    fi
    git checkout -- grpo_conform/checks/probes.py 2>/dev/null || sed -i 's/make_probe((G.ZERO_ADVANTAGE, /make_probe((/' \
      grpo_conform/checks/probes.py
    exec env CALL_S=$(( ${CALL_S:-585} - SECONDS )) bash "$0" s36a
    ;;
  z37)  # thirty-seventh session: the float16 zero-advantage crash (4a27fd0 took zero-advantage out of other-dtypes after
         # triton's float16 E/E-all calls hit an illegal memory access on an H100). Puts it back in this copy only
         # (sed), then runs the three masked members at mask-small-bf16 with launches synchronous, so the failing
         # kernel is named; compute-sanitizer where the image has it. Then s36a in what is left (CALL_S)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    sed -i 's/^OTHER_DTYPES = other_dtypes.make_probe((L.EXACT_TIES,/OTHER_DTYPES = other_dtypes.make_probe((G.ZERO_ADVANTAGE, L.EXACT_TIES,/' \
      grpo_conform/checks/probes.py
    grep -c "make_probe((G.ZERO_ADVANTAGE" grpo_conform/checks/probes.py | sed 's/^/zero-advantage back in other-dtypes: /' | tee -a "$R/status.txt"
    CUDA_LAUNCH_BLOCKING=1 timeout -s KILL 150 python3 -m grpo_conform check implementations/triton --member dapo-mask \
      --member token-offpolicy-mask-kl --workload mask-small-bf16 --device cuda --no-timing --no-evidence --format json \
      > "$R/z37.json" 2> "$R/z37.log"
    status "zero-advantage in float16, launches synchronous: exit $?"; grep -E "FAILED|passed \(" "$R/z37.log" | head
    python3 - "$R/z37.json" <<'PY' | tee -a "$R/status.txt"
import json, sys
for r in json.load(open(sys.argv[1]))["implementations"]:
    for w in r["workloads"]:
        for c in w["checks"]:
            if c["status"] not in ("pass", "skipped"):
                print(w["workload"], c["check"], c["status"], str(c.get("message"))[:1500])
PY
    git checkout -- grpo_conform/checks/probes.py 2>/dev/null || sed -i 's/make_probe((G.ZERO_ADVANTAGE, /make_probe((/' \
      grpo_conform/checks/probes.py
    exec env CALL_S=$(( ${CALL_S:-585} - SECONDS )) bash "$0" s36a
    ;;
  nt36)  # thirty-sixth session: the near-ties check on CUDA (honest kernels of both operations pass it, the fused
         # gallery folder fails it: exit 1), then s36a in what is left of the call (CALL_S, default 585)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    for what in "implementations/triton-fused --member token-offpolicy-mask --member token-offpolicy-mask-kl-ref-weight --member dapo-mask --workload tiny-bf16 --workload seed-b2" \
                "implementations/triton --member token-offpolicy-mask --member dapo-mask --workload mask-small-bf16 --workload mask-b8" \
                "implementations/fused-liger --member token-offpolicy-mask --workload seed-b2" \
                "tests/gallery/fused-ratio-branch-in-operand-dtype --workload tiny-bf16"; do
      tag=$(echo "$what" | cut -d' ' -f1 | tr / -)
      timeout -s KILL 150 python3 -m grpo_conform check $what --device cuda --no-timing --no-evidence -k near-ties \
        -k gradient -k loss > "$R/nt-$tag.txt" 2>&1
      status "near-ties on CUDA, $tag: exit $?"; tail -1 "$R/nt-$tag.txt"
    done
    exec env CALL_S=$(( ${CALL_S:-585} - SECONDS )) bash "$0" s36a
    ;;
  s34)  # thirty-fourth session: whichever card came. An H200: triton-fused at seed-b2..b16 with records (issue 32: the
        # H200 has no record of identity 1a23faaacdef; MEMBERS, default the first five, DEADLINE default 440). Another
        # card: mem35's HEAD run alone, with FALLBACK=default the default check of triton with timing, no records, with
        # FALLBACK=none nothing
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    if grep -q H200 "$R/nvidia-smi.txt"; then
      status "an H200: triton-fused records"
      # exec: the part it hands over to packs $OUT itself (a second pack here wrote an empty archive, call 1)
      exec env MEMBERS="${MEMBERS:-token-is token-is-bias token-offpolicy-mask token-offpolicy-mask-kl token-offpolicy-mask-kl-ref-weight}" \
        DEADLINE="${DEADLINE:-440}" bash "$0" round32t
    elif [ "${FALLBACK:-mem35}" = none ]; then
      status "not an H200: nothing run (FALLBACK=none)"
    elif [ "${FALLBACK:-mem35}" = default ]; then
      status "not an H200: the default check of triton with timing, no records (a first run)"
      rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
      default_check "${DEADLINE:-240}"
    else
      status "not an H200: the default check's memory (mem35, HEAD only)"
      exec env ORDER=B bash "$0" mem35
    fi
    ;;
  s34b)  # thirty-fourth session (~3 min): reach's peaks on CUDA (honest kernels of both operations pass reach,
         # the gallery's online log-sum-exp without a rescale fails it), then where the masked member's launch-bound
         # call goes (benchmarks/research/host_overhead_probe.py: host profile and device kernels, three members;
         # the kernels at V 32000 b8)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    for what in "implementations/triton-fused --member token-offpolicy-mask --workload tiny-bf16" \
                "implementations/triton --member token-offpolicy-mask --workload mask-small-bf16" \
                "tests/gallery/fused-reach-vocab-tiles --workload tiny-bf16" \
                "tests/gallery/reach-vocab-halves --workload mask-small-bf16"; do
      tag=$(echo "$what" | cut -d' ' -f1 | tr / -)
      timeout -s KILL 150 python3 -m grpo_conform check $what --device cuda -k reach --no-timing --no-evidence \
        > "$R/reach-$tag.txt" 2>&1
      status "reach on CUDA, $what: exit $?"; grep -E "reach " "$R/reach-$tag.txt" | head -3 | cut -c1-400
    done
    if [ "${PROBE:-1}" = 1 ]; then
      timeout -s KILL 240 python3 benchmarks/research/host_overhead_probe.py > "$R/host-overhead.txt" 2>&1
      status "host_overhead_probe: exit $?"
      grep -vE "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ " "$R/host-overhead.txt" | cut -c1-160 | head -150
    fi
    ;;
  mem35)  # thirty-third session (issue 35, ~8 min): the memory a workload's grant asks for, HEAD's estimate (B) against
          # another (A: a copy of the tree with device_memory.py's two constants set from ALT="SETS GIB", default
          # "12 4", what ran as B on 2026-12-06 at 31ed16e). Each a first run (compile stores cleared) of the default
          # check without timing; the GPU's used memory sampled every 0.25 s; every workload's draws keep its grant,
          # its wait and the slot's and worker's reserved peaks. Then the gate's CUDA test (tests/test_gpu_share_cuda.py)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    read -r alt_sets alt_gib <<< "${ALT:-12 4}"
    rm -rf /tmp/A && mkdir /tmp/A && cp -a grpo_conform implementations specs pyproject.toml /tmp/A/
    sed -i "s/^SETS_PER_WORKLOAD = .*/SETS_PER_WORKLOAD = $alt_sets/; s/^FIXED_BYTES = .*/FIXED_BYTES = $alt_gib << 30/" \
      /tmp/A/grpo_conform/device_memory.py
    grep -hE "^(SETS_PER_WORKLOAD|FIXED_BYTES) =" /tmp/A/grpo_conform/device_memory.py grpo_conform/device_memory.py
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 250 > "$R/memory-used.csv" &
    smi=$!
    for v in ${ORDER:-A B}; do
      rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
      dir=$PWD; [ "$v" = A ] && dir=/tmp/A
      echo "$v start $(date -u +%H:%M:%S.%N)" >> "$R/marks.txt"
      start=$SECONDS
      (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout -s KILL ${LIMIT:-230} python3 -m grpo_conform check \
        implementations/triton --no-timing --no-evidence --profile-phases --deadline ${DEADLINE:-200} --format json \
        > "$R/default-$v.json" 2> "$R/default-$v.log")
      status "default check without timing, grant estimate $v: exit $?, $((SECONDS - start)) s wall"
      echo "$v end $(date -u +%H:%M:%S.%N)" >> "$R/marks.txt"
      grep -E "^  (gate-wait|worker|inputs|judge|reference|other) " "$R/default-$v.log"
      python3 benchmarks/phase_summary.py "$R/default-$v.json" | grep "^grant"
    done
    kill $smi
    timeout -s KILL 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_share_cuda.py > "$R/gpu-share-tests.txt" 2>&1
    status "tests/test_gpu_share_cuda.py: exit $?"; tail -2 "$R/gpu-share-tests.txt"
    ;;
  once32)  # thirty-second session (~4-8 min): compile ahead without and with the once-per-member calls' proxies
           # (reach, other-dtypes: grpo_conform/checks/member_calls.py), each on a first run (compile stores cleared):
           # eight masked members, two a slot, no timing, no records (ORDER, default "0 1"); then, with B16_MEMBERS,
           # triton-fused's records at seed-b16 for those members in the time left
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    margs=()
    for m in token-offpolicy-mask bnpo-mask dr-grpo-mask dapo-mask cispo-mask sapo-mask vespo-mask luspo-mask; do
      margs+=(--member "$m")
    done
    for v in ${ORDER:-0 1}; do
      export GRPO_CONFORM_COMPILE_AHEAD_ONCE=$v
      rm -rf "$HOME/.triton" "$HOME/.cache/grpo-conform"
      start=$SECONDS
      timeout -s KILL 200 python3 -m grpo_conform check implementations/triton "${margs[@]}" --no-timing --no-evidence \
        --profile-phases --deadline 160 --format json > "$R/once-$v.json" 2> "$R/once-$v.log"
      status "compile ahead, once-per-member calls $v: exit $?, $((SECONDS - start)) s wall"
      grep -E "^  (gate-wait|worker|compile-ahead|reach|other-dtypes) " "$R/once-$v.log"
    done
    unset GRPO_CONFORM_COMPILE_AHEAD_ONCE
    left=$(( ${BUDGET_S:-520} - SECONDS ))
    if [ -n "${B16_MEMBERS:-}" ] && [ "$left" -gt 150 ]; then
      margs=()
      for m in $B16_MEMBERS; do margs+=(--member "$m"); done
      start=$SECONDS
      timeout -s KILL "$left" python3 -m grpo_conform check implementations/triton-fused "${margs[@]}" --workload seed-b16 \
        --evidence-dir "$OUT/h200" --deadline $((left - 110)) --profile-phases --format json \
        > "$R/triton-fused-b16.json" 2> "$R/triton-fused-b16.log"
      status "triton-fused seed-b16 ($B16_MEMBERS): exit $?, $((SECONDS - start)) s wall (limit $left s)"
      tail -2 "$R/triton-fused-b16.log"
    fi
    ;;
  round35c)  # twenty-seventh session (~7 min): the default check of triton on a first run, its records kept (issue
             # 35's budget, the folder's identity unchanged); then the three fused cells round32aa's --deadline left
             # untimed (token-offpolicy-mask at seed-b4, the reference-weight member at seed-b2 and b4)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    default_check 240 records
    start=$SECONDS
    timeout -s KILL 230 python3 -m grpo_conform check implementations/triton-fused --member token-offpolicy-mask \
      --member token-offpolicy-mask-kl-ref-weight --workload seed-b2 --workload seed-b4 --evidence-dir "$OUT/h200" \
      --deadline 180 --profile-phases --format json > "$R/fused-rest.json" 2> "$R/fused-rest.log"
    status "triton-fused token-offpolicy-mask + ref-weight seed-b2/b4: exit $?, $((SECONDS - start)) s wall"
    tail -2 "$R/fused-rest.log"
    ls "$OUT/h200" | wc -l
    ;;
  round32z)  # issue 32, twenty-fourth session: the epilogue forward (implementations/triton-fused/epilogue.py) on CUDA.
             # Its tests beside the staged sweep's, the ceiling GEMM on its own operands against the workload's, the
             # profile of ours (epilogue, staged, pipelined) at b2/b4 (~4 min); then, with MEMBERS set, their records at
             # WORKLOADS (default seed-b2..b16; the folder's new identity) under DEADLINE (default 300)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    if [ -z "${CHECK_ONLY:-}" ]; then  # CHECK_ONLY=1: the records alone (the later calls of a round)
      if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: not again (68 passed on an H100 at cb70bc1)
        timeout -s KILL 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_fused_staged.py > "$R/staged-tests.txt" 2>&1
        status "staged + epilogue forward tests (CUDA): exit $?"; tail -3 "$R/staged-tests.txt" | cut -c1-600
      fi
      timeout -s KILL 100 python3 benchmarks/research/gemm_operands.py --workload seed-b2 --rounds 3 \
        --out "$R/gemm-operands.json" > "$R/gemm-operands.log" 2>&1
      status "gemm_operands seed-b2: exit $?"; tail -6 "$R/gemm-operands.log"
      timeout -s KILL 150 python3 benchmarks/fused_profile.py --batches 2 4 --reps 10 \
        --out "$R/fused-profile.json" > "$R/fused-profile.log" 2>&1
      status "fused_profile b2 b4: exit $?"; grep -v "^      \|Warn\|warn" "$R/fused-profile.log" | cut -c1-160
    fi
    if [ -n "${MEMBERS:-}" ]; then
      margs=()
      for m in $MEMBERS; do margs+=(--member "$m"); done
      for w in ${WORKLOADS:-seed-b2 seed-b4 seed-b8 seed-b16}; do margs+=(--workload "$w"); done
      start=$SECONDS
      timeout -s KILL $((${DEADLINE:-300} + 50)) python3 -m grpo_conform check implementations/triton-fused "${margs[@]}" \
        --evidence-dir "$OUT/h200" \
        --deadline "${DEADLINE:-300}" --profile-phases --format json > "$R/triton-fused.json" 2> "$R/triton-fused.log"
      status "triton-fused ${WORKLOADS:-seed-b2..b16} ($MEMBERS): exit $?, $((SECONDS - start)) s wall"
      tail -4 "$R/triton-fused.log"
      ls "$OUT/h200" | wc -l
    fi
    ;;
  sweep36c)  # issue 36 (run in the twenty-fifth session): what V 32000 still lacks (docs/triton-kernel-notes.md, "V 32000 rules on the H200"): fp16
             # rules and the masked members' 1.23-1.29x. --configs at V 32000 in bf16 and fp16 over token-is, the masked
             # token member and GSPO (a level's rule is chosen over all of its members), the V 32000 grid beside it,
             # the seed vocabulary at b8 as control (`--plan` estimates ~80 s of jobs + ~45 s compiled ahead)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.txt"
    timeout -s KILL 300 python3 benchmarks/sweep_logits.py --configs --vocab 32000 --control 128256:8 \
      --configs-vocab 32000 --configs-dtypes bfloat16,float16 \
      --configs-members token-is,token-offpolicy-mask,sequence-offpolicy-mask --no-launch --budget-s 240 \
      --out "$R/sweep.json" > "$R/sweep.log" 2>&1
    status "sweep_logits V 32000 (+128256 b8) --configs bf16+fp16, three members: exit $?"; tail -c 9000 "$R/sweep.log"
    ;;
  sandbox)  # issue 11 item 9, well under 90 s: the worker inside bubblewrap, unpacked from the carried .deb
    rm -rf /tmp/bw && mkdir -p /tmp/bw
    for deb in .debs/bubblewrap_*.deb; do dpkg -x "$deb" /tmp/bw; done
    export GRPO_CONFORM_BWRAP=/tmp/bw/usr/bin/bwrap
    { "$GRPO_CONFORM_BWRAP" --version; ls -ld /dev/nvidia* /dev/shm; } > "$R/sandbox-bwrap.txt" 2>&1
    status "bwrap: $(head -1 "$R/sandbox-bwrap.txt")"
    timeout -s KILL 55 python3 -m grpo_conform check implementations/triton --member token-is --workload small-bf16 \
      --device cuda --no-timing --no-evidence --sandbox bwrap > "$R/sandbox-triton.txt" 2>&1
    status "sandbox bwrap, triton token-is small-bf16: exit $? (0: conformant under the sandbox)"
    timeout -s KILL 25 python3 -m grpo_conform check tests/gallery/escapes-sandbox --workload small-bf16 \
      --device cuda --no-timing --no-evidence --sandbox bwrap > "$R/sandbox-escapes.txt" 2>&1
    status "sandbox bwrap, escapes-sandbox small-bf16: exit $? (1: runs fails, both escapes refused)"
    grep -h "sandbox: \|escape refused\|^error: \|exit code" "$R"/sandbox-triton.txt "$R"/sandbox-escapes.txt | cut -c1-400
    ;;
esac
ls /dev/shm > "$R/dev-shm-after.txt" 2>&1
python3 benchmarks/summarize_device.py "$R" 2>/dev/null | tail -40
# The part packs $OUT itself and removes what it packed: a device command adds no tar of its own after it
# (one did on 2026-12-05, wrote an empty archive over this one, and nine signed-to-be records were lost). A
# second part in the same command gets an archive of its own (-2, -3, ...), never one written over.
pack=$OUT/h200-${1:-probe}.tgz; n=2
while [ -e "$pack" ]; do pack=$OUT/h200-${1:-probe}-$n.tgz; n=$((n + 1)); done
tar czf "$pack" -C "$OUT" h200 reports && rm -rf "$OUT/h200" "$OUT/reports"
