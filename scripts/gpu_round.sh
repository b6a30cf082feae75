#!/usr/bin/env bash
# The GPU-host calls behind docs/QUALITY.md's rows for packing by default (workload c), the
# first good result on a GPU host (workload a) and the CPU rerun against tuned baselines, on
# one nvidia-h200-x4 (4 GPUs, 64 cores), carry [".wheelhouse", "bench-quality-c42"]:
#
#   scripts/gpu_round.sh a      # about 9 minutes: probe, curves, (a) CPU and GPU-host pairs
#   scripts/gpu_round.sh c-best SEEDS   # (c): ours against the best baseline, 80 s a seed
#   scripts/gpu_round.sh c-oracle K SEEDS   # (c): ours against Optuna packed K to a GPU
#
# Everything lands in $OUT as a few archives (the tool brings back at most 8 files).
#
# a: cores 16-55 run the (a) CPU comparison against tuned baselines (docs/QUALITY.md, "Not run
#    yet": its reference, seeds 101-103, then ours against the best of it, seeds 1-10); beside
#    it, on GPUs 0-3 and cores 0-15, the start-up probe, the CNN's curves at 1-4 trials per
#    GPU (scripts/record_curves.py), then, once the CPU reference has set (a)'s targets, ours
#    against that best baseline on the GPU host (halves of GPUs 0-3 and cores 0-15), 5 seeds,
#    20 s each: the first good result is start-up and a trial.
set -uo pipefail
set -m  # the background set is a process group of its own: stopped whole if it runs long
out="${OUT:?set OUT (the device tool does)}"
what="${1:?a, c-best or c-oracle}"
shift
pack() {  # the results as archives, whatever happened before
    local name="$1"
    shift
    tar -czf "$out/$name.tgz" -C "$out" "$@" 2>/dev/null && (cd "$out" && rm -rf "$@")
}
case "$what" in
a)
    # the CPU set installs into its own folder, so that it never waits on the GPU side
    (QUALITY_SET=cpu-expert HPO_SITE=/tmp/hpo-site-cpu taskset -c 16-63 bash -c '
        scripts/gpu_quality.sh --workload a --reference --seeds 101-103 --budget 240 --no-gpu \
            --concurrent 18 --cpus 16-51 --contenders optuna-cpu-t1-median-tuned,optuna-cpu-t1-hyperband-tuned,optuna-cpu-t1-none,optuna-cpu-t2-median-tuned,optuna-cpu-t2-hyperband-tuned,optuna-cpu-t2-none &&
        scripts/gpu_quality.sh --workload a --seeds 1-10 --budget 120 --pair ours,best --no-gpu \
            --concurrent 10 --cpus 16-55' > "$out/cpu-expert.log" 2>&1) &
    cpu=$!
    source scripts/gpu_site.sh
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader > "$out/gpus.txt"
    CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 python3 scripts/probe_startup.py --repeat 5 \
        --out "$out/probe.json" > "$out/probe.txt" 2>&1
    python3 scripts/record_curves.py "$out/curves-c" --seconds 90 --cpus 0-15 > "$out/curves.log" 2>&1
    for _ in $(seq 300); do  # (a)'s targets: the CPU reference's best, 3 seeds
        [[ -s "$out/cpu-expert/targets.json" ]] && break
        sleep 2
    done
    mkdir -p bench-quality-agpu && cp "$out/cpu-expert/targets.json" bench-quality-agpu/
    # what finished is in results.json: stop in time to bring everything back (a call's 600 s)
    timeout $((560 - SECONDS)) env QUALITY_SET=agpu taskset -c 0-15 scripts/gpu_quality.sh \
        --workload a --budget 20 --seeds 1-5 --pair ours,best --cpus 0-15 > "$out/agpu.log" 2>&1
    while kill -0 "$cpu" 2>/dev/null && (( SECONDS < 570 )); do sleep 2; done
    kill -- -"$cpu" 2>/dev/null; pkill -f bench_quality.py 2>/dev/null
    pack a-results probe.json probe.txt gpus.txt curves-c curves.log agpu agpu.log
    pack cpu-expert cpu-expert cpu-expert.log
    ;;
c-best|c-oracle)
    if [[ "$what" == c-oracle ]]; then other="optuna-hyperband-x${1:?K}"; shift; else other=best; fi
    seeds="${1:?SEEDS, e.g. 6-10}"
    QUALITY_SET=c42 taskset -c 48-63 scripts/gpu_quality.sh --workload c --budget 80 \
        --seeds "$seeds" --pair "ours,$other" --cpus 48-63 --common-start 10 > "$out/$what.log" 2>&1
    pack "$what-$seeds" c42 "$what.log"
    ;;
*)
    echo "usage: scripts/gpu_round.sh a | c-best SEEDS | c-oracle K SEEDS" >&2
    exit 2
    ;;
esac
