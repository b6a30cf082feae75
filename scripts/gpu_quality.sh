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
# HPO_SITE: another install folder, for a set that must not share the CUDA build (say a CPU
# workload started beside workload b, which would otherwise wait for the build and use it)
site="${HPO_SITE:-/tmp/hpo-site}"
wheels="${WHEELS:-.wheelhouse}"
set_name="${QUALITY_SET:-gpu}"
out="${OUT:?set OUT (the device tool does)}/$set_name"
cuda_sdist="${LIGHTGBM_CUDA_SDIST:-}"  # e.g. .wheelhouse-cuda/lightgbm-4.7.0.tar.gz
if [[ ! -d "$site/optuna" || ( -n "$cuda_sdist" && ! -f "$site/.lightgbm-cuda" ) ]]; then
    # one installer at a time: two sets started together share the site folder
    exec 9>"$site.lock"
    flock 9
    if [[ ! -d "$site/optuna" ]]; then
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site.tmp" \
            "$wheels"/* > "$site.pip.txt" 2>&1 || { cat "$site.pip.txt"; exit 1; }
        mv "$site.tmp" "$site"
    fi
    if [[ -n "$cuda_sdist" && ! -f "$site/.lightgbm-cuda" ]]; then
        # LightGBM's CUDA learner, built here from its sdist (PyPI's wheel has none), in place
        # of PyPI's wheel for every contender: about 3 minutes on 8 cores (docs/GPU.md)
        python3 -m pip wheel -q --no-deps --no-index --no-build-isolation -w /tmp/lightgbm-cuda \
            --config-settings=cmake.define.USE_CUDA=ON \
            --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90 "$cuda_sdist" \
            > "$site.cuda-build.txt" 2>&1 || { tail -30 "$site.cuda-build.txt"; exit 1; }
        python3 -m pip install -q --no-index --no-deps --upgrade --target "$site" \
            /tmp/lightgbm-cuda/lightgbm-*.whl > "$site.pip.txt" 2>&1 \
            || { cat "$site.pip.txt"; exit 1; }
        touch "$site/.lightgbm-cuda"
    fi
    flock -u 9
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
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
