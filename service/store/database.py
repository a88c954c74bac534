"""The engine and its units of work: SQLite (WAL, synchronous=NORMAL) by default, PostgreSQL for shared stores; any
database failure is ``StorageUnavailable`` (503 + Retry-After)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from service.errors import StorageUnavailable
from service.store.migration import migrate

log = logging.getLogger("service.store")

T = TypeVar("T")


def create_engine(url: str, timeout: float) -> sa.Engine:
    """The engine: a query waits at most ``timeout`` seconds for a lock or a connection, and on PostgreSQL runs at
    most that long, so a stuck store answers 503 in bounded time."""
    if url.startswith("sqlite"):
        # a small statement cache: IN lists of varying length are a new prepared statement each
        engine = sa.create_engine(
            url,
            connect_args={"timeout": timeout, "check_same_thread": False, "cached_statements": 32},
            pool_pre_ping=True,
        )

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    ms = max(1, int(timeout * 1000))
    options = f"-c statement_timeout={ms} -c lock_timeout={ms}"
    postgres = {"connect_timeout": max(1, round(timeout)), "options": options} if url.startswith("postgresql") else {}
    return sa.create_engine(
        url, pool_pre_ping=True, pool_size=5, max_overflow=5, pool_timeout=timeout, connect_args=postgres
    )


def unbounded(connection: sa.Connection) -> None:
    """Lift the statement and lock timeouts for this transaction (migrations and retention may be long)."""
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SET LOCAL statement_timeout = 0"))
        connection.execute(sa.text("SET LOCAL lock_timeout = 0"))


class Database:
    """The engine, the schema check and the units of work every store module runs in (blocking)."""

    def __init__(self, url: str, retry_after: int = 1, timeout: float = 5.0):
        self.url = url
        self.retry_after = retry_after
        self.engine = create_engine(url, timeout)
        self.schema_ready = False
        self.last_error: str | None = None

    @contextmanager
    def unit(self, write: bool = True) -> Iterator[sa.Connection]:
        """A connection in one transaction: committed when ``write``, else one snapshot for all its reads (REPEATABLE
        READ; a deferred BEGIN on SQLite, whose driver would run each SELECT on its own); failures:
        ``StorageUnavailable``."""
        try:
            if not self.schema_ready:
                self.migrate()
            with self.engine.begin() if write else self.engine.connect() as connection:
                if not write and connection.dialect.name == "postgresql":
                    connection.execution_options(isolation_level="REPEATABLE READ")  # in psycopg's BEGIN: no round trip
                elif not write and connection.dialect.name == "sqlite":
                    connection.exec_driver_sql("BEGIN")  # rolled back when the connection closes
                yield connection
        except SQLAlchemyError as exc:  # OperationalError, DBAPIError and every other driver failure
            raise self.unavailable(exc) from exc
        self._recovered()

    def run(self, work: Callable[[sa.Connection], T], write: bool = True) -> T:
        """``work(connection)`` in one unit of work."""
        with self.unit(write) as connection:
            return work(connection)

    def migrate(self) -> None:
        """Create or upgrade the schema (``service.store.migration``)."""
        with self.engine.begin() as connection:
            unbounded(connection)
            migrate(connection)
        self.schema_ready = True

    def ping(self) -> bool:
        """Whether the store answers now; any failure (unreachable, pool exhausted, timeout) is False."""
        try:
            with self.engine.connect() as connection:
                connection.execute(sa.text("SELECT 1"))
        except SQLAlchemyError as exc:
            self.unavailable(exc)
            return False
        self._recovered()
        return True

    def unavailable(self, exc: Exception) -> StorageUnavailable:
        """The 503 for a failed operation; the driver's text goes to the log, never to the client."""
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__
        if self.last_error is None:
            log.warning("database unavailable: %s", error)
        self.last_error = error
        return StorageUnavailable("the feedback store is unavailable; retry later", self.retry_after)

    def _recovered(self) -> None:
        if self.last_error is not None:
            log.warning("database available again")
            self.last_error = None
