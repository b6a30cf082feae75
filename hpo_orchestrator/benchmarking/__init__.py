"""The time-to-quality benchmark's parts that are worth importing and testing (issue 26):
``quality`` (targets, time to target with censoring, the paired tests, quartile bands),
``goals`` (the goals judged from kept results),
``workloads`` (the benchmark's objectives for Optuna's own processes, built from the
product's data generator and search space, and the held-out test metric), ``cnn`` (the
GPU-bound torch workload, a custom objective the product runs by ``objective.target``),
``records`` (one compact record per trial of a run, kept in results.json).

They live in the package, not under scripts/, so that tests import them without path tricks,
a product worker can import the CNN objective on any host (the GPU host runs from a source
tree on PYTHONPATH, nothing installed), and mypy checks them. scripts/bench_quality.py
launches the contenders and writes the results.
"""

from __future__ import annotations

__all__: list[str] = []
