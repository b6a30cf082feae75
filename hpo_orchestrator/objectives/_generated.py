"""Generated data sets (fixed seed): the built-in objectives need no download.

:func:`binary_classification` is cached per process: a reuse worker runs many trials, and
regenerating (and re-copying) the same arrays for each would be pure start-up cost per
trial. The arrays are shared between trials, so callers must not write to them.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["binary_classification", "held_out_test"]


def _generate(n_rows: int, n_features: int, seed: int,
              n_test: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``x, y`` of the task's ``n_rows`` rows, then ``n_test`` more rows of the same task.

    The test rows are drawn after everything the first rows need, from the same generator, so
    the first ``n_rows`` do not depend on ``n_test``; they share the weights and the label
    threshold (the median of the first rows' logits).
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n_features)).astype(np.float32)
    informative = max(4, n_features // 4)
    w = rng.standard_normal(informative)

    def logits(rows: np.ndarray) -> np.ndarray:
        out = rows[:, :informative] @ w
        out += 1.5 * np.sin(2.0 * rows[:, 0]) * rows[:, 1]
        out += 0.8 * (rows[:, 2] * rows[:, 3] > 0.5)
        out += rng.standard_normal(len(rows)) * 1.0  # label noise: a floor on the loss
        return out  # type: ignore[no-any-return]

    train_logits = logits(x)
    threshold = np.median(train_logits)
    x_test = rng.standard_normal((n_test, n_features)).astype(np.float32)
    test_logits = logits(x_test)
    return (x, (train_logits > threshold).astype(np.float32),
            x_test, (test_logits > threshold).astype(np.float32))


@functools.cache
def binary_classification(n_rows: int, n_features: int, seed: int,
                          valid_fraction: float = 0.2) -> tuple[np.ndarray, ...]:
    """A non-linear binary task with interactions and label noise, so that model capacity
    and regularisation both matter (a linear task would make every trial alike).

    Returns ``x_train, y_train, x_valid, y_valid`` as float32 / float32, generated once per
    process for each argument set (cached: do not modify them).
    """
    x, y, _, _ = _generate(n_rows, n_features, seed, 0)
    split = int(n_rows * (1.0 - valid_fraction))
    return x[:split], y[:split], x[split:], y[split:]


def held_out_test(n_rows: int, n_features: int, seed: int,
                  n_test: int) -> tuple[np.ndarray, np.ndarray]:
    """``n_test`` rows of the same task as ``binary_classification(n_rows, n_features, seed)``
    that neither its training nor its validation rows contain: a test split for judging a
    search's best model where no trial looked (scripts/bench_quality.py)."""
    _, _, x_test, y_test = _generate(n_rows, n_features, seed, n_test)
    return x_test, y_test
