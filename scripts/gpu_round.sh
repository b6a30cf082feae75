#!/usr/bin/env bash
# The GPU-host calls behind docs/QUALITY.md's rows for packing by default (workload c), ours'
# start-up on a GPU host and the (a) CPU rerun against tuned baselines, on one warm
# nvidia-h200-x2 (2 GPUs, 32 cores; the 4-GPU kind was not lent), carry
# [".wheelhouse", "bench-quality-c42"], calls back to back:
#
#   scripts/gpu_round.sh first SEED   # about 8 minutes: starts the CPU set, then the start-up
#                                     # probe, (c)'s curves at 1 and 3 trials per GPU, (c) SEED
#   scripts/gpu_round.sh c SEEDS      # (c), about 5 minutes a seed
#
# (c), on GPUs 0-1 and cores 0-15: one contender at a time (solo mode, the first place
# rotating with the seed): ours (today's defaults), the best baseline (optuna-hyperband: one
# Optuna process per GPU, its reference's best) and optuna-hyperband-x3 (Optuna's processes
# packed by hand, 3 to a GPU: the better fixed number of the 1 and 3 measured on an H200),
# each 70 s, the same 10 start-up points (--common-start 10); targets from the best
# baseline's kept runs, seeds 1-5, at 140 s (bench-quality-c42/targets.json), so these seeds
# are 6 on.
# The CPU set, on cores 16-31 in a session of its own (it outlives the call that starts it
# and runs on through the next ones): workload (a) with no GPU, the reference of Optuna's
# tuned pruners (seeds 101-103, 240 s, 2 cores a run), then ours against its best (seeds
# 1-10, 120 s, pairs of 2 + 2 cores). Each call brings back what it has so far.
# Everything lands in $OUT as a few archives (the tool brings back at most 8 files).
set -uo pipefail
out="${OUT:?set OUT (the device tool does)}"
what="${1:?first or c}"
shift
cpu_out=/tmp/cpu-out
pack() {  # the results as archives, whatever happened before
    local name="$1"
    shift
    tar -czf "$out/$name.tgz" -C "$out" "$@" 2>/dev/null && (cd "$out" && rm -rf "$@")
}
c_seeds() {
    QUALITY_SET=c42 taskset -c 0-15 scripts/gpu_quality.sh --workload c --budget 70 \
        --seeds "$1" --contenders ours,best,optuna-hyperband-x3 --cpus 0-15 --common-start 10 \
        > "$out/c.log" 2>&1
    pack "c-$1" c42 c.log
}
cpu_so_far() {
    tar -czf "$out/cpu-expert.tgz" -C "$cpu_out" . 2>/dev/null
}
case "$what" in
first)
    source scripts/gpu_site.sh
    mkdir -p "$cpu_out"
    setsid env OUT="$cpu_out" QUALITY_SET=cpu-expert taskset -c 16-31 bash -c '
        scripts/gpu_quality.sh --workload a --reference --seeds 101-103 --budget 240 --no-gpu \
            --concurrent 8 --cpus 16-31 \
            --contenders optuna-cpu-t1-median-tuned,optuna-cpu-t1-hyperband-tuned,optuna-cpu-t1-none &&
        scripts/gpu_quality.sh --workload a --seeds 1-10 --budget 120 --pair ours,best --no-gpu \
            --concurrent 4 --cpus 16-31
        echo "exit $?" > '"$cpu_out"'/done' > "$cpu_out/cpu-expert.log" 2>&1 < /dev/null &
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader > "$out/gpus.txt"
    CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 python3 scripts/probe_startup.py --repeat 5 \
        --out "$out/probe.json" > "$out/probe.txt" 2>&1
    python3 scripts/record_curves.py "$out/curves-c" --levels 1,3 --gpus 0,1 --seconds 80 \
        --cpus 0-15 > "$out/curves.log" 2>&1
    pack first probe.json probe.txt gpus.txt curves-c curves.log
    c_seeds "${1:?SEED}"
    cpu_so_far
    ;;
c)
    c_seeds "${1:?SEEDS, e.g. 7-8}"
    cpu_so_far
    ;;
*)
    echo "usage: scripts/gpu_round.sh first SEED | c SEEDS" >&2
    exit 2
    ;;
esac
