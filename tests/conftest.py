"""Suite-wide isolation (no test writes the default feedback store into the working tree) and the real
PostgreSQL for the tests that use it. tests/vision runs in the
torchvision venv (``make test-vision``); the core venv, which has no torchvision, does not collect it and says so."""

import pytest

from training.vision import torchvision_available

HAS_TORCHVISION = torchvision_available()
# tests/conformance holds client scripts that run in venvs of their own (make conformance), never collected here
collect_ignore = ["conformance"] + ([] if HAS_TORCHVISION else ["vision"])


def pytest_report_header(config):
    if not HAS_TORCHVISION:
        return "tests/vision not collected: torchvision does not import in this venv (they run in `make test-vision`)"
    return None


@pytest.fixture(scope="session", autouse=True)
def free_grpc_ports():
    """Every service a test starts, in-process or as a child process, serves gRPC on a free port (shown in
    /health) rather than 8081, so that several can run at once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CALIB_GRPC_PORT", "0")
        yield


@pytest.fixture(scope="session", autouse=True)
def isolated_feedback_store(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CALIB_DATABASE_URL", f"sqlite:///{tmp_path_factory.mktemp('store') / 'monitoring.db'}")
        yield


def pytest_collection_modifyitems(items):
    """``slow`` implies ``e2e``: the fast tier (``pytest -m "not e2e"``) leaves slow tests out too."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.e2e)


def postgres_url() -> str:
    """The machine's PostgreSQL (database test), emptied of this service's tables."""
    import sqlalchemy as sa

    from service.store.schema import metadata

    url = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        metadata.drop_all(connection)
    engine.dispose()
    return url


@pytest.fixture
def pg_url() -> str:
    """The real PostgreSQL, emptied of this service's tables."""
    return postgres_url()


@pytest.fixture(scope="session")
def postgres():
    """``postgres_url()``: the real PostgreSQL, emptied of this service's tables, for module fixtures."""
    return postgres_url
