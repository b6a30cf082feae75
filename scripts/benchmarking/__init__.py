"""The time-to-quality benchmark's parts that are worth importing and testing:
``quality`` (targets, time to target with censoring, the paired tests, quartile bands),
``goals`` (the goals judged from kept results),
``workloads`` (the benchmark's objectives for Optuna's own processes, built from the
product's data generator and search space, and the held-out test metric), ``cnn`` (the
GPU-bound torch workload, a custom objective the product runs by ``objective.target``),
``records`` (one compact record per trial of a run, kept in results.json).

They serve this repository only, so they live beside the script that launches the
contenders and writes the results (scripts/bench_quality.py), not in the installed package.
The repository's root is on the path wherever they run: the tests run from it, and
bench_quality.py puts it on PYTHONPATH for every process it launches (the GPU host runs from
a source tree, the package's dependencies from a wheelhouse), so a product worker imports the
CNN objective as ``scripts.benchmarking.cnn:objective``. ``make lint`` type-checks them.
"""

from __future__ import annotations

__all__: list[str] = []
