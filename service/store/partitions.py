"""The prediction log's partitions on PostgreSQL: one per UTC day, a range of ids (an id begins with its
millisecond time, so an id range is a time range and the id stays the key).

Why a day: retention keeps N to N + 1 days, so a day is the most a prediction outlives its period; a day's
partition and its primary key are written at their end only; and 30 days of retention plan over about 34 partitions,
few enough that a query the planner cannot prune stays cheap, where hours would make hundreds (decision 0036).

Partitions are created ``AHEAD`` days ahead, as a standalone table then attached (ATTACH takes a SHARE UPDATE
EXCLUSIVE lock on the log, which inserts and reads pass; CREATE TABLE ... PARTITION OF would take an exclusive
one). Expired partitions are detached CONCURRENTLY (PostgreSQL 14 and later) and dropped: no row of the log is
scanned or deleted. Every DDL statement waits at most ``LOCK_WAIT`` for its lock and is retried later, so no
statement queues the log's readers and writers behind it for long."""

from __future__ import annotations

import datetime as dt
import logging
from typing import NamedTuple

import sqlalchemy as sa

from service.store import locks
from service.store.rows import first_id
from service.store.schema import id_value

log = logging.getLogger("service.store")

DAY = 86400.0
AHEAD = 3  # days of partitions kept ready after today's
LOCK_WAIT = "500ms"
_PREFIX = "prediction_log_p"


class Partition(NamedTuple):
    """One day's partition: its name, the time range [start, end) of its ids and whether a concurrent detach of it
    was interrupted (it must be finalized)."""

    name: str
    start: float
    end: float
    detaching: bool = False


def partition_of(at: float) -> Partition:
    """The partition holding the ids of time ``at``."""
    start = (at // DAY) * DAY
    day = dt.datetime.fromtimestamp(start, dt.timezone.utc)
    return Partition(f"{_PREFIX}{day:%Y%m%d}", start, start + DAY)


def existing(c: sa.Connection) -> list[Partition]:
    """The log's partitions, oldest first."""
    rows = c.exec_driver_sql(
        "SELECT c.relname, i.inhdetachpending FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'prediction_log'::regclass"
    ).all()
    return sorted((_named(name, bool(detaching)) for name, detaching in rows), key=lambda p: p.start)


def detached(c: sa.Connection) -> list[Partition]:
    """Tables of the log's partitions that are no longer attached (detached by a pass that could not drop them)."""
    rows = c.exec_driver_sql(
        "SELECT relname FROM pg_class WHERE relkind = 'r' AND NOT relispartition AND relname LIKE 'prediction_log_p%%'"
    ).all()
    return sorted((_named(name) for (name,) in rows), key=lambda p: p.start)


def _named(name: str, detaching: bool = False) -> Partition:
    day = dt.datetime.strptime(name[len(_PREFIX) :], "%Y%m%d").replace(tzinfo=dt.timezone.utc).timestamp()
    return Partition(name, day, day + DAY, detaching)


def bound(at: float) -> str:
    """The partition bound of time ``at``: its first id as PostgreSQL writes a uuid."""
    return str(id_value(first_id(at), "postgresql"))


def make_ahead(c: sa.Connection, now: float) -> list[str]:
    """Create the partitions from yesterday's to the one ``AHEAD`` days after today's (``create``): the upkeep's and
    the migration's, so that writes never wait for one; the names created."""
    return create(c, now - DAY, now + (AHEAD + 1) * DAY)


def create(c: sa.Connection, start: float, end: float) -> list[str]:
    """Create the partitions for the ids of times [start, end) that do not exist yet, in the caller's transaction,
    under the migration lock (replicas take turns); the names created."""
    locks.advisory_lock(c, locks.MIGRATION)
    c.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
    have = {p.name for p in existing(c)}
    made, at = [], start
    while at < end:
        part = partition_of(at)
        at = part.end
        if part.name in have:
            continue
        c.exec_driver_sql(f"CREATE TABLE {part.name} (LIKE prediction_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        c.exec_driver_sql(
            f"ALTER TABLE prediction_log ATTACH PARTITION {part.name} "
            f"FOR VALUES FROM ('{bound(part.start)}') TO ('{bound(part.end)}')"
        )
        made.append(part.name)
    if made:
        log.info("created prediction log partitions %s", ", ".join(made))
    return made


def detach_and_drop(engine: sa.Engine, part: Partition, attached: bool = True) -> None:
    """Detach ``part`` without blocking the log (CONCURRENTLY runs outside a transaction; one interrupted before is
    finalized), then drop it (``attached`` False: only drop it). A lock not had within ``LOCK_WAIT`` raises; the
    next pass tries again, and finds the table detached or still attached."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql(f"SET lock_timeout = '{LOCK_WAIT}'")
        c.exec_driver_sql("SET statement_timeout = 0")
        if attached:
            how = "FINALIZE" if part.detaching else "CONCURRENTLY"
            c.exec_driver_sql(f"ALTER TABLE prediction_log DETACH PARTITION {part.name} {how}")
        c.exec_driver_sql(f"DROP TABLE {part.name}")
    log.info("dropped prediction log partition %s", part.name)
