#!/usr/bin/env bash
# One GPU-host call of the time-to-quality benchmark (docs/QUALITY.md, "GPU host"):
#   scripts/gpu_quality.sh --workload a --budget 90 --seeds 1-4 --pair ours,best
# Installs the wheelhouse as scripts/gpu_host_check.sh does (once per machine), starts from
# the results carried in bench-quality-gpu/ (results.json, targets.json of earlier calls),
# runs scripts/bench_quality.py into $OUT/q with --slim (no sqlite files or trial logs come
# back; results.json holds every curve). Several invocations in one call append to $OUT/q.
set -euo pipefail
site=/tmp/hpo-site
wheels="${WHEELS:-.wheelhouse}"
out="${OUT:?set OUT (the device tool does)}/q"
if [[ ! -d "$site/optuna" ]]; then
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" \
        "$wheels"/* > /tmp/quality-pip.txt 2>&1 || { cat /tmp/quality-pip.txt; exit 1; }
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
if [[ ! -f "$out/results.json" ]]; then
    cp bench-quality-gpu/*.json "$out/" 2>/dev/null || true
fi
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$out/gpus.txt" || true
python3 scripts/bench_quality.py --out "$out" --slim "$@"
