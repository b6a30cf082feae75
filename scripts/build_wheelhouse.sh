#!/usr/bin/env bash
# Build a folder of wheels for an offline GPU node, so that
#   pip install --no-index --find-links WHEELS hpo-orchestrator-deps
# works there. Run it on a machine with PyPI access.
#
# Usage: scripts/build_wheelhouse.sh [DEST] [PYTHON_VERSION]
#   DEST            folder to fill (default: .wheelhouse)
#   PYTHON_VERSION  the GPU node's Python, e.g. 3.12 (default: 3.12)
#
# Packages that GPU images usually ship (torch, numpy, scipy, pyyaml, psutil, rich,
# nvidia-ml-py, ...) are dropped afterwards to keep the folder small; set KEEP_ALL=1
# to keep them.
set -euo pipefail

dest="${1:-.wheelhouse}"
pyver="${2:-3.12}"
mkdir -p "$dest"

pip download --quiet --only-binary=:all: --python-version "$pyver" \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 \
    -d "$dest" "optuna>=5,<6" "sqlalchemy>=2,<3" "lightgbm>=4,<5" "psycopg[binary]>=3" PyYAML \
    "plotly>=5.20" "matplotlib>=3.7" "submitit>=1.5"
# hydra-core needs antlr4-python3-runtime, which is published only as an sdist (pure Python,
# builds offline), so the binary-only resolver above cannot take hydra-core with its deps.
pip download --quiet --only-binary=:all: --no-deps --python-version "$pyver" -d "$dest" \
    "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4"
pip download --quiet --no-deps --no-binary=:all: -d "$dest" antlr4-python3-runtime==4.9.3

if [[ "${KEEP_ALL:-0}" != 1 ]]; then
    for name in numpy scipy PyYAML pyyaml packaging typing_extensions MarkupSafe markupsafe; do
        rm -f "$dest/$name"-*.whl
    done
fi
echo "wheelhouse: $dest ($(du -sh "$dest" | cut -f1))"
ls "$dest"
