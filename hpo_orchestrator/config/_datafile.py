"""``objective.data``: the user's own table (CSV or Parquet), checked once at load.

The file must exist, have a known suffix, and hold ``objective.target_column``; Parquet needs
pyarrow. ``objective.task=regression`` needs a numeric target. Found here, before a study is
created, rather than in every trial's child.
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from hpo_orchestrator.errors import ConfigError

__all__ = ["SUFFIXES", "check_data_file", "columns_of", "parquet_reader_missing"]

SUFFIXES = (".csv", ".parquet", ".pq")


def parquet_reader_missing() -> bool:
    return importlib.util.find_spec("pyarrow") is None


def columns_of(path: Path) -> list[str]:
    """The table's column names (the CSV's header line; the Parquet file's schema)."""
    if path.suffix.lower() == ".csv":
        with path.open(newline="") as handle:
            return next(csv.reader(handle), [])
    import pyarrow.parquet as pq

    return list(pq.read_schema(path).names)


def text_cell(path: Path, column: str) -> str | None:
    """A non-empty cell of ``column`` that is not a number (the first), or None."""
    if path.suffix.lower() == ".csv":
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                cell = row.get(column) or ""
                try:
                    float(cell or "nan")  # an empty cell is a missing value
                except ValueError:
                    return cell
        return None
    import pyarrow.parquet as pq
    import pyarrow.types as pat

    kind = pq.read_schema(path).field(column).type
    return None if pat.is_integer(kind) or pat.is_floating(kind) or pat.is_null(kind) else str(kind)


def check_data_file(data: str | None, target_column: str | None, path: str,
                    task: str = "auto") -> str | None:
    """The absolute path of ``data`` (children and hpo.config then name the same file);
    ConfigError when it cannot be used."""
    if data is None:
        if target_column is not None:
            raise ConfigError(f"{path}.target_column: applies only with {path}.data",
                              f"e.g. {path}.data=train.csv {path}.target_column=label")
        return None
    file = Path(data).expanduser()
    if not file.is_file():
        raise ConfigError(f"{path}.data: no file {data!r}",
                          "give a CSV or Parquet file, e.g. objective.data=train.csv "
                          "objective.target_column=label (relative to the current folder)")
    if file.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"{path}.data: expected a .csv or .parquet file, got {file.name!r}",
                          "export the table as CSV (a header line, then one row per sample)")
    if file.suffix.lower() != ".csv" and parquet_reader_missing():
        raise ConfigError(f"{path}.data: reading Parquet needs pyarrow, which is not installed",
                          "pip install pyarrow (into this .venv), or convert the file to CSV")
    if not target_column:
        raise ConfigError(f"{path}.target_column: is required with {path}.data",
                          f"name the column to predict, e.g. {path}.target_column=label")
    try:
        columns = columns_of(file)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}.data: cannot read {data!r}: {exc}",
                          "is it a CSV file with a header line, or a Parquet file?") from None
    if target_column not in columns:
        shown = ", ".join(columns[:20]) + (", ..." if len(columns) > 20 else "")
        raise ConfigError(f"{path}.target_column: no column {target_column!r} in {data!r}",
                          f"its columns: {shown or 'none (empty file?)'}")
    if len(columns) < 2:
        raise ConfigError(f"{path}.data: {data!r} has no feature column besides the target",
                          "the table needs the target and at least one feature column")
    if task == "regression":  # else LightGBM fails every trial on the coded labels' meaning
        text = text_cell(file, target_column)
        if text is not None:
            raise ConfigError(
                f"{path}.task=regression: the target column {target_column!r} holds text "
                f"({text[:40]!r}), not numbers",
                f"leave {path}.task=auto (text targets are classes: binary or multiclass), or "
                "predict a numeric column")
    return str(file.resolve())
