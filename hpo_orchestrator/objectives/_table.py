"""The user's own table (``objective.data``) as arrays for LightGBM, with no pandas needed.

CSV: a header line, then one row per sample. A column whose every non-empty cell is a number
is numeric (empty cells are missing values); any other column is categorical, coded by its
sorted distinct values and handed to LightGBM as a categorical feature. Parquet (pyarrow)
columns go through the same rules.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Table", "infer_task", "load_table", "split"]

# A target with at most this many distinct integer values is classes, more is a regression.
_MAX_CLASSES = 50


@dataclass(frozen=True)
class Table:
    x: np.ndarray  # float64, NaN where missing
    y: np.ndarray  # float64 (class codes for a categorical target)
    features: list[str]
    categorical: list[int]  # column indices of x coded from text
    target_labels: list[str] | None  # class names when the target was text


def _column(cells: list[Any]) -> tuple[np.ndarray, list[str] | None]:
    """Numbers as float64 (None/'' missing), or codes of the sorted distinct texts."""
    values: list[float] = []
    for cell in cells:
        if cell is None or cell == "":
            values.append(np.nan)
            continue
        try:
            values.append(float(cell))
        except (TypeError, ValueError):
            break
    else:
        return np.asarray(values, dtype=np.float64), None
    labels = sorted({str(c) for c in cells if c is not None and c != ""})
    code = {label: float(i) for i, label in enumerate(labels)}
    return np.asarray([np.nan if c is None or c == "" else code[str(c)] for c in cells],
                      dtype=np.float64), labels


def _read_columns(path: Path) -> dict[str, list[Any]]:
    if path.suffix.lower() == ".csv":
        with path.open(newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader)
            rows = [row for row in reader if row]
        return {name: [row[i] if i < len(row) else "" for row in rows]
                for i, name in enumerate(header)}
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pydict()  # type: ignore[no-any-return]


def load_table(path: str, target_column: str) -> Table:
    columns = _read_columns(Path(path))
    y, target_labels = _column(columns.pop(target_column))
    keep = ~np.isnan(y)  # a row without a target teaches nothing
    features: list[str] = []
    arrays: list[np.ndarray] = []
    categorical: list[int] = []
    for name, cells in columns.items():
        array, labels = _column(cells)
        if labels is not None:
            categorical.append(len(arrays))
        features.append(name)
        arrays.append(array[keep])
    return Table(np.column_stack(arrays), y[keep], features, categorical, target_labels)


def infer_task(table: Table) -> str:
    """binary, multiclass or regression, from the target's values."""
    distinct = np.unique(table.y)
    if table.target_labels is not None or (
            len(distinct) <= _MAX_CLASSES and np.all(distinct == np.round(distinct))):
        return "binary" if len(distinct) <= 2 else "multiclass"
    return "regression"


def split(table: Table, valid_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """A seeded shuffle, then ``x_train, y_train, x_valid, y_valid``."""
    order = np.random.default_rng(seed).permutation(len(table.y))
    cut = int(len(order) * (1.0 - valid_fraction))
    train, valid = order[:cut], order[cut:]
    return table.x[train], table.y[train], table.x[valid], table.y[valid]
