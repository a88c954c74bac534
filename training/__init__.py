"""Training side of calibrated-serving (torch-only; never imported by the service)."""
