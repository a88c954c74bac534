"""Suite-wide isolation (no test writes the default feedback store into the working tree) and a real PostgreSQL for
the tests that use it: the one ``CALIB_TEST_DATABASE_URL`` names, or a throwaway one the suite starts. tests/vision
runs in the torchvision venv (``make test-vision``); the core venv, which has no torchvision, does not collect it
and says so."""

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from training.vision import torchvision_available

HAS_TORCHVISION = torchvision_available()
# tests/conformance holds scripts that run in venvs of their own (make conformance, shift-refs), never collected here
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
        patch.setenv("CALIB_STORE__URL", f"sqlite:///{tmp_path_factory.mktemp('store') / 'monitoring.db'}")
        yield


def pytest_collection_modifyitems(items):
    """``slow`` implies ``e2e``: the fast tier (``pytest -m "not e2e"``) leaves slow tests out too."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.e2e)


#: Points the suite at an existing PostgreSQL (a SQLAlchemy URL whose database the suite may empty of this
#: service's tables); unset, the suite starts a throwaway server of its own.
TEST_DATABASE_URL = "CALIB_TEST_DATABASE_URL"


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory) -> Iterator[str]:
    """The PostgreSQL the suite uses, as a URL: ``CALIB_TEST_DATABASE_URL`` when set, else a throwaway cluster
    started by pytest-postgresql's executor (``PostgreSQLExecutor``, pg_ctl) in a directory of its own, on a free
    port, stopped and removed at the end of the session. PostgreSQL refuses to run as root, so under root (CI) the
    cluster runs as an unprivileged user (``postgres`` where Debian's package made one, else ``nobody``). The URL is
    also exported as ``CALIB_TEST_DATABASE_URL`` and ``CALIB_BENCH_DATABASE_URL`` for the processes tests start."""
    given = os.environ.get(TEST_DATABASE_URL)
    if given:
        yield _worker_database(given)
        return
    from port_for import get_port
    from pytest_postgresql.executors import PostgreSQLExecutor

    pg_ctl = _pg_ctl()
    work = Path(tempfile.mkdtemp(prefix="calib-pg-"))
    executable = pg_ctl
    if os.geteuid() == 0:
        user = "postgres" if _user_exists("postgres") else "nobody"
        shutil.chown(work, user)
        executable = str(work / "pg_ctl")
        Path(executable).write_text(f'#!/bin/sh\nexec runuser -u {user} -- "{pg_ctl}" "$@"\n')
        os.chmod(executable, 0o755)
        os.chmod(work, 0o755)
    port = get_port(None)
    executor = PostgreSQLExecutor(
        executable=executable,
        host="127.0.0.1",
        port=port,
        user="postgres",
        dbname="test",
        datadir=str(work / "data"),
        unixsocketdir=str(work),
        logfile=str(work / "postgresql.log"),
        startparams="-w",
        postgres_options="-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300",
    )
    executor.start()
    try:
        executor.wait_for_postgres()
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"
        _create_database(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", "test")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(TEST_DATABASE_URL, url)
            patch.setenv("CALIB_BENCH_DATABASE_URL", url)
            yield url
    finally:
        executor.stop()
        shutil.rmtree(work, ignore_errors=True)


def _pg_ctl() -> str:
    """pg_ctl: on the PATH, or Debian's (/usr/lib/postgresql/<major>/bin, the newest)."""
    found = shutil.which("pg_ctl")
    if found:
        return found
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not debian:
        pytest.fail(
            "no PostgreSQL: install Debian's postgresql (`make tools` does) or set CALIB_TEST_DATABASE_URL", False
        )
    return str(debian[-1])


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _worker_database(url: str) -> str:
    """``url`` itself in a run of one process; under pytest-xdist a database of the worker's own on its server
    (``<database>_<worker>``, created when missing), since each worker empties the service's tables as it goes."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return url
    import sqlalchemy as sa

    base = sa.make_url(url)
    name = f"{base.database}_{worker}"
    _create_database(base.set(database="postgres").render_as_string(hide_password=False), name)
    return base.set(database=name).render_as_string(hide_password=False)


def _create_database(maintenance_url: str, name: str) -> None:
    """Database ``name`` on the server of ``maintenance_url``, created unless it exists."""
    import sqlalchemy as sa

    engine = sa.create_engine(maintenance_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        if not connection.exec_driver_sql("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).first():
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine.dispose()


def empty_postgres(url: str) -> str:
    """The PostgreSQL at ``url``, emptied of this service's tables. A connection an earlier test left in a reference
    cycle keeps its transaction, and the locks that would block the drop, until the collector frees it: collected
    first, and a drop still blocked fails after a minute, naming the sessions it could be waiting on, instead of
    waiting for ever."""
    import gc

    import sqlalchemy as sa

    from service.store.legacy import legacy_metadata
    from service.store.schema import metadata

    gc.collect()
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("SET LOCAL lock_timeout = '60s'")
            metadata.drop_all(connection)  # the log's partitions go with it
            legacy_metadata.drop_all(connection)  # the log of schema version 2
    except sa.exc.OperationalError as error:
        if getattr(error.orig, "sqlstate", None) != "55P03":  # lock_not_available: the lock timeout
            raise
        pytest.fail(f"an earlier test left a transaction open; the sessions it could be: {_sessions(engine)}", False)
    finally:
        engine.dispose()
    return url


def _sessions(engine) -> list[str]:
    """The database's other sessions: state, transaction start, last query and the local process holding the client
    end of each (``ss``), to name the test that left one open."""
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT client_port, state, xact_start, left(query, 200) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).all()
    described = []
    for port, state, start, query in rows:
        ss = ["ss", "-tnpH", f"sport = :{port}"]
        owner = subprocess.run(ss, capture_output=True, text=True).stdout if shutil.which("ss") and port else ""
        pid = re.search(r"pid=(\d+)", owner)
        cmdline = Path(f"/proc/{pid[1]}/cmdline") if pid else None
        command = cmdline.read_bytes().replace(b"\0", b" ").decode() if cmdline and cmdline.exists() else "?"
        described.append(f"{state} since {start}: {query!r} from pid {pid[1] if pid else '?'} ({command})")
    return described


@pytest.fixture
def pg_url(postgres_server) -> str:
    """The suite's PostgreSQL, emptied of this service's tables."""
    return empty_postgres(postgres_server)


@pytest.fixture(scope="session")
def postgres(postgres_server):
    """A function that returns the suite's PostgreSQL, emptied of this service's tables, for module fixtures."""
    return lambda: empty_postgres(postgres_server)
