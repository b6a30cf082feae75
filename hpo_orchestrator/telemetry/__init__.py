"""Telemetry: GPU/CPU sampling per trial, its aggregates, and the ``hpo_telemetry`` table."""

from hpo_orchestrator.telemetry._aggregate import PhaseStats, TrialTelemetry
from hpo_orchestrator.telemetry._sampler import TelemetrySampler
from hpo_orchestrator.telemetry._table import (
    TELEMETRY_COLUMNS,
    ensure_table,
    insert_samples,
    telemetry_table,
)

__all__ = ["TELEMETRY_COLUMNS", "PhaseStats", "TelemetrySampler", "TrialTelemetry", "ensure_table",
           "insert_samples", "telemetry_table"]
