"""One-off investigations kept to rerun where their question comes back; outside the test suite."""
