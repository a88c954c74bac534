"""Suite-wide isolation: no test writes the default feedback store into the working tree."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_feedback_store(tmp_path_factory):
    previous = os.environ.get("CALIB_DATABASE_URL")
    os.environ["CALIB_DATABASE_URL"] = f"sqlite:///{tmp_path_factory.mktemp('store') / 'monitoring.db'}"
    yield
    if previous is None:
        os.environ.pop("CALIB_DATABASE_URL", None)
    else:
        os.environ["CALIB_DATABASE_URL"] = previous


def pytest_collection_modifyitems(items):
    """``slow`` implies ``e2e``: the fast tier (``pytest -m "not e2e"``) leaves slow tests out too."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.e2e)
