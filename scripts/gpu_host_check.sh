#!/usr/bin/env bash
# Verify the product on an offline GPU host: install the missing dependencies from a
# wheelhouse (scripts/build_wheelhouse.sh), run the GPU test suite and a short real study
# while nvidia-smi records per-GPU utilization, and collect everything in OUT.
#
# Usage: scripts/gpu_host_check.sh [WHEELHOUSE] [OUT]
# Exits non-zero as soon as a step fails (pytest's status included: pipefail sees through tee),
# and with pytest's status 1 when no GPU test ran (HPO_TEST_REQUIRE_GPU, tests/conftest.py).
set -euo pipefail
wheels="${1:-.wheelhouse}"
out="${2:-${OUT:-gpu-report}}"
mkdir -p "$out"
site=/tmp/hpo-site
# --target resolves as if nothing were installed, so install exactly the wheelhouse (--no-deps);
# the packages it leaves out (numpy, PyYAML, ...) come from the host's Python.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" \
    "$wheels"/* > "$out/pip.txt" 2>&1 || { cat "$out/pip.txt"; exit 1; }
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 COLUMNS=160

{
    nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv
    ls /etc/OpenCL/vendors 2>/dev/null || echo "no OpenCL ICD registry (/etc/OpenCL/vendors)"
    python3 -c "from hpo_orchestrator.gpu._opencl import list_platforms as l; print('platforms (registry only):', l())"
    OCL_ICD_FILENAMES=$(python3 -c "from hpo_orchestrator.gpu._opencl import nvidia_icd_env as e; print(e().get('OCL_ICD_FILENAMES',''))") \
        python3 -c "from hpo_orchestrator.gpu._opencl import list_platforms as l; print('platforms (NVIDIA ICD added):', l())"
} 2>&1 | tee "$out/host.txt"

HPO_TEST_REQUIRE_GPU=1 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/gpu/test_gpu.py 2>&1 \
    | tee "$out/pytest-gpu.txt"

# A short real study on every GPU while nvidia-smi samples utilization once a second.
work=$(mktemp -d)
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw \
    --format=csv,noheader -l 1 > "$out/nvidia-smi.csv" &
smi=$!
trap 'kill $smi 2>/dev/null || true' EXIT  # also when a step below fails
(cd "$work" && python3 -m hpo_orchestrator run scheduler.parallel=4 study.n_trials=16 \
    objective.n_rows=400000 objective.num_boost_round=200) 2>&1 | tee "$out/study-lightgbm.txt"
(cd "$work" && python3 -m hpo_orchestrator run objective=torch_mlp study.name=mlp \
    scheduler.parallel=4 study.n_trials=8 objective.n_samples=200000 objective.epochs=6) \
    2>&1 | tee "$out/study-torch.txt"
(cd "$work" && python3 -m hpo_orchestrator status --study hpo && python3 -m hpo_orchestrator status --study mlp \
    && python3 -m hpo_orchestrator telemetry --study hpo --csv "$out/telemetry-hpo.csv") \
    2>&1 | tee "$out/status.txt"
python3 scripts/bench_sampler.py --trials 8 --seconds 20 2>&1 | tee "$out/bench-sampler.txt"
python3 - "$work/hpo.db" <<'PY' | tee "$out/trials.txt"
import json, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
for study, number, state, start, end, tid in con.execute(
        "SELECT s.study_name, t.number, t.state, t.datetime_start, t.datetime_complete, t.trial_id "
        "FROM trials t JOIN studies s USING (study_id) ORDER BY s.study_name, t.number"):
    a = {k: json.loads(v) for k, v in con.execute(
        "SELECT key, value_json FROM trial_user_attributes WHERE trial_id=?", (tid,))}
    eff = a.get("hpo.params_effective") or {}
    print(study, number, state, start, end, "gpu", a.get("hpo.gpu_index"),
          "startup", a.get("hpo.startup_s"), eff.get("device_type", eff.get("device")),
          eff.get("gpu_platform_id"), a.get("hpo.opencl_platform"), a.get("hpo.warning"),
          "util", a.get("hpo.gpu_util_mean"), "train", a.get("hpo.gpu_util_compute_mean"),
          "mem", a.get("hpo.gpu_mem_peak_mib"), "J", a.get("hpo.gpu_energy_j"),
          "verified", a.get("hpo.gpu_verified"))
PY
cp "$work/hpo.db" "$out/hpo.db"
