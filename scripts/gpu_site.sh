# Sourced by the GPU-host scripts (gpu_quality.sh, record_curves.sh): the wheelhouse
# installed into a site folder once per machine, as scripts/gpu_host_check.sh does (with
# LIGHTGBM_CUDA_SDIST=PATH also LightGBM built there with its CUDA learner), then PYTHONPATH
# set to the checkout and that folder.
# HPO_SITE: another install folder, for a set that must not share the CUDA build (say a CPU
# workload started beside workload b, which would otherwise wait for the build and use it)
site="${HPO_SITE:-/tmp/hpo-site}"
wheels="${WHEELS:-.wheelhouse}"
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
