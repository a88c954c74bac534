"""Monitoring: labelled feedback, calibration versions, the alarm and the reports, over the shared store."""

from service.monitoring.monitor import Monitor

__all__ = ["Monitor"]
