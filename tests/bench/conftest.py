import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """bench/ sets the settings' old names until it moves to the new ones: their warnings are shown, not errors."""
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.filterwarnings("default::FutureWarning:service.settings.deprecated"))


@pytest.fixture(autouse=True)
def store_under_the_benchmarks_name(monkeypatch):
    """The suite's store (``CALIB_STORE__URL``, tests/conftest.py) under the old name ``CALIB_DATABASE_URL`` that
    bench/ still sets for the services it starts: a new name wins over its old one, so the suite's would take the
    place of each benchmark's own store. Goes when bench/ names the store ``CALIB_STORE__URL``."""
    monkeypatch.setenv("CALIB_DATABASE_URL", os.environ["CALIB_STORE__URL"])
    monkeypatch.delenv("CALIB_STORE__URL")
