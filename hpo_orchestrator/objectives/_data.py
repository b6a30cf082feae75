"""Generated data sets (fixed seed): the built-in objectives need no download."""

from __future__ import annotations

import numpy as np

__all__ = ["binary_classification"]


def binary_classification(n_rows: int, n_features: int, seed: int,
                          valid_fraction: float = 0.2) -> tuple[np.ndarray, ...]:
    """A non-linear binary task with interactions and label noise, so that model capacity
    and regularisation both matter (a linear task would make every trial alike).

    Returns ``x_train, y_train, x_valid, y_valid`` as float32 / float32.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n_features)).astype(np.float32)
    informative = max(4, n_features // 4)
    w = rng.standard_normal(informative)
    logits = x[:, :informative] @ w
    logits += 1.5 * np.sin(2.0 * x[:, 0]) * x[:, 1]
    logits += 0.8 * (x[:, 2] * x[:, 3] > 0.5)
    logits += rng.standard_normal(n_rows) * 1.0  # label noise: a floor on the loss
    y = (logits > np.median(logits)).astype(np.float32)
    split = int(n_rows * (1.0 - valid_fraction))
    return x[:split], y[:split], x[split:], y[split:]
