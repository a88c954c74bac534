"""The prediction log's partitions on PostgreSQL: one per UTC day of ids (decision 0036), made ``AHEAD`` days ahead
and attached, expired ones detached CONCURRENTLY and dropped. Each DDL waits at most ``LOCK_WAIT`` for its lock."""

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
    """One day's partition: its name, the time range [start, end) of its ids and whether a detach was interrupted."""

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
    """Create the partitions from yesterday's to ``AHEAD`` days after today's, so writes never wait for one."""
    return create(c, now - DAY, now + (AHEAD + 1) * DAY)


def create(c: sa.Connection, start: float, end: float) -> list[str]:
    """Create the missing partitions of times [start, end) under the migration lock; the names created."""
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
    """Detach ``part`` without blocking the log (or finalize an interrupted detach), then drop it (``attached``
    False: only drop it); a lock not had within ``LOCK_WAIT`` raises and the next pass tries again."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql(f"SET lock_timeout = '{LOCK_WAIT}'")
        c.exec_driver_sql("SET statement_timeout = 0")
        if attached:
            how = "FINALIZE" if part.detaching else "CONCURRENTLY"
            c.exec_driver_sql(f"ALTER TABLE prediction_log DETACH PARTITION {part.name} {how}")
        c.exec_driver_sql(f"DROP TABLE {part.name}")
    log.info("dropped prediction log partition %s", part.name)
