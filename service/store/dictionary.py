"""The prediction log's dictionaries, ``calibration_keys`` and ``served_choices``: what rows repeat, stored once and
referenced by a small integer; committed before use, never changed, cached per process."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import NamedTuple

import sqlalchemy as sa

from service.store.database import Database
from service.store.rows import CalibrationKey
from service.store.schema import calibration_keys, scope, served_choices


class Choice(NamedTuple):
    """What a row was served with: its set choice (None for each when no set) and the priors' version."""

    set_coverage: float | None
    set_method: str | None
    set_randomized: bool | None
    priors_version: str | None

    @property
    def signature(self) -> str:
        return json.dumps(list(self))


NO_CHOICE = Choice(None, None, None, None)


def _insert_missing(c: sa.Connection, table: sa.Table, values: list[dict], unique: list[str]) -> None:
    """Insert ``values`` into ``table``, skipping those another writer added (``unique``: the unique columns)."""
    from sqlalchemy.dialects import postgresql, sqlite

    insert = postgresql.insert if c.dialect.name == "postgresql" else sqlite.insert
    c.execute(insert(table).on_conflict_do_nothing(index_elements=unique), values)


class Dictionaries:
    """The cached dictionaries of one process's store."""

    def __init__(self, db: Database):
        self.db = db
        self._keys: dict[CalibrationKey, int] = {}
        self._key_of: dict[int, tuple[CalibrationKey, float | None]] = {}
        self._choices: dict[Choice, int] = {}
        self._choice_of: dict[int, Choice] = {}

    def key_ids(self, pairs: Iterable[tuple[CalibrationKey, float | None]]) -> dict[CalibrationKey, int]:
        """The ids of the keys of (key, temperature or None) ``pairs``, added when missing (or without temperature)."""
        wanted: dict[CalibrationKey, float | None] = {}
        for key, temperature in pairs:  # a key's temperature is the first one given
            if wanted.get(key) is None:
                wanted[key] = temperature
        missing = {
            k: t
            for k, t in wanted.items()
            if k not in self._keys or (t is not None and self._key_of[self._keys[k]][1] is None)
        }
        if missing:
            self.db.run(lambda c: self._add_keys(c, missing))
        return {k: self._keys[k] for k in wanted}

    def stored_temperature(self, key_id: int) -> float | None:
        """The temperature stored with a key ``key_ids`` returned."""
        return self._key_of[key_id][1]

    def _add_keys(self, c: sa.Connection, missing: dict[CalibrationKey, float | None]) -> None:
        _insert_missing(
            c,
            calibration_keys,
            [k._asdict() | {"temperature": t} for k, t in missing.items()],
            ["model", "version", "calibration_version"],
        )
        for key, t in missing.items():
            if t is not None:
                c.execute(
                    calibration_keys.update()
                    .where(*scope(calibration_keys, key), calibration_keys.c.temperature.is_(None))
                    .values(temperature=t)
                )
        self._load_keys(c)

    def _load_keys(self, c: sa.Connection) -> None:
        for row in c.execute(sa.select(calibration_keys)):
            key = CalibrationKey(row.model, row.version, row.calibration_version)
            self._keys[key], self._key_of[row.id] = row.id, (key, row.temperature)

    def key_id(self, c: sa.Connection, key: CalibrationKey) -> int | None:
        """The id of ``key`` as stored (None: no row has it yet), read on ``c`` when not cached."""
        if key not in self._keys:
            self._load_keys(c)
        return self._keys.get(key)

    def all_key_ids(self, c: sa.Connection) -> list[int]:
        """Every key's id, read on ``c`` (the table is small)."""
        return [r[0] for r in c.execute(sa.select(calibration_keys.c.id))]

    def key_of(self, c: sa.Connection, key_id: int) -> tuple[CalibrationKey, float | None]:
        """The key and temperature of ``key_id``."""
        if key_id not in self._key_of:
            self._load_keys(c)
        return self._key_of[key_id]

    def choice_ids(self, wanted: Iterable[Choice]) -> dict[Choice, int]:
        """The ids of ``wanted`` choices, added when missing."""
        wanted = set(wanted)
        missing = wanted - self._choices.keys()
        if missing:
            self.db.run(lambda c: self._add_choices(c, missing))
        return {choice: self._choices[choice] for choice in wanted}

    def _add_choices(self, c: sa.Connection, missing: set[Choice]) -> None:
        _insert_missing(
            c, served_choices, [choice._asdict() | {"signature": choice.signature} for choice in missing], ["signature"]
        )
        self._load_choices(c)

    def _load_choices(self, c: sa.Connection) -> None:
        for row in c.execute(sa.select(served_choices)):
            choice = Choice(row.set_coverage, row.set_method, row.set_randomized, row.priors_version)
            self._choices[choice], self._choice_of[row.id] = row.id, choice

    def choice_of(self, c: sa.Connection, choice_id: int | None) -> Choice:
        if choice_id is None:
            return NO_CHOICE
        if choice_id not in self._choice_of:
            self._load_choices(c)
        return self._choice_of[choice_id]
