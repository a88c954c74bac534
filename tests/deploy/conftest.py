"""Fixtures for the tests that hold the deployment files (Dockerfile, compose, Kubernetes, KServe) to the
service and start processes as they would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="session")
def dockerfile() -> dict:
    """The Dockerfile's runtime stage: its CMD, EXPOSE (the first port, HTTP, and all of them), the uid of its
    user and its ENV, for the tests that hold the deployment manifests to the image."""
    text = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text().replace("\\\n", " ")
    runtime = text[text.index("AS runtime\n") :]
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(re.findall(r"^ENV (.+)$", runtime, flags=re.M))))
    return {
        "cmd": yaml.safe_load(re.search(r"^CMD (.+)$", runtime, flags=re.M).group(1)),
        "expose": int(re.search(r"^EXPOSE (\d+)", runtime, flags=re.M).group(1)),  # the HTTP port
        "exposed": [int(p) for p in re.search(r"^EXPOSE (.+)$", runtime, flags=re.M).group(1).split()],
        "uid": int(re.search(r"--uid (\d+)", runtime).group(1)),
        "env": env,
    }
