"""Telemetry: GPU/CPU sampling per trial and its per-trial, per-phase aggregates.

The samples go to the ``hpo_telemetry`` table (hpo_orchestrator.db).
"""

from hpo_orchestrator.telemetry._aggregate import PhaseStats, TrialTelemetry
from hpo_orchestrator.telemetry._export import export_csv
from hpo_orchestrator.telemetry._retention import TelemetryRetention
from hpo_orchestrator.telemetry._sampler import DeviceReading, TelemetrySampler

__all__ = ["DeviceReading", "PhaseStats", "TelemetryRetention", "TelemetrySampler", "TrialTelemetry",
           "export_csv"]
