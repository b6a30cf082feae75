#!/usr/bin/env bash
# One GPU-host call of the time-to-quality benchmark (docs/QUALITY.md, "GPU host"):
#   scripts/gpu_quality.sh --workload a --budget 90 --seeds 1-4 --pair ours,best
# Installs the wheelhouse as scripts/gpu_host_check.sh does (once per machine; with
# LIGHTGBM_CUDA_SDIST=PATH also LightGBM built there with its CUDA learner), starts from
# the results carried in bench-quality-$QUALITY_SET/ (results.json, targets.json of earlier
# calls; QUALITY_SET defaults to gpu), runs scripts/bench_quality.py into $OUT/$QUALITY_SET
# with --slim (no sqlite files or trial logs; results.json holds every curve, and the runs'
# process logs come back as process-logs.tgz).
# Several invocations in one call append to the same folder; two sets (say gpu and cpu: a
# CPU workload on some cores with --no-gpu --cpus, beside a GPU one on the others) run at
# once from separate invocations, each with its own folder.
set -euo pipefail
set_name="${QUALITY_SET:-gpu}"
out="${OUT:?set OUT (the device tool does)}/$set_name"
source "$(dirname "$0")/gpu_site.sh"
mkdir -p "$out"
if [[ ! -f "$out/results.json" ]]; then
    cp "bench-quality-$set_name"/*.json "$out/" 2>/dev/null || true
fi
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$out/gpus.txt" || true
# The runs' folders stay on the host (the device tool brings back a limited number of files);
# their process logs come back as one archive.
runs="/tmp/quality-runs/$set_name"
status=0
python3 scripts/bench_quality.py --out "$out" --runs "$runs" --slim "$@" || status=$?
tar -czf "$out/process-logs.tgz" -C "$runs" . 2>/dev/null || true
exit "$status"
