#!/usr/bin/env bash
# One GPU-host call that records workload (c)'s learning curves with no pruner at 1-4 trials
# per GPU, on GPUs 0-3 at once (scripts/record_curves.py; docs/QUALITY.md, "Pruners by
# simulation"):
#   scripts/record_curves.sh --seconds 120 --cpus 0-63
# Installs the wheelhouse as scripts/gpu_quality.sh does, then writes $OUT/curves-c/:
# c-tpg1.db.gz .. c-tpg4.db.gz, summary.json, logs.tgz.
set -euo pipefail
source "$(dirname "$0")/gpu_site.sh"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader || true
python3 scripts/record_curves.py "${OUT:?set OUT (the device tool does)}/curves-c" "$@"
