"""Bulk insert of plain tuples by each driver's fastest path."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from service.store.schema import PredictionId, id_value

# SQLite: full chunks by one multi-row statement, the rest row by row: the driver caches statements by text
_SQLITE_CHUNK = 256
# binary COPY needs each column's exact wire type
_BINARY_TYPES = {
    sa.String: "text",
    sa.Integer: "int4",
    sa.Float: "float8",
    sa.LargeBinary: "bytea",
    sa.Boolean: "bool",
    PredictionId: "uuid",
}


class BulkInsert:
    """Bulk insert of plain tuples: binary COPY on PostgreSQL, multi-row INSERTs on SQLite."""

    def __init__(self, table: sa.Table, columns: Sequence[str]):
        names, placeholders = ", ".join(columns), f"({', '.join('?' * len(columns))})"
        self.table, self.columns = table, list(columns)
        self.insert_row = f"INSERT INTO {table.name} ({names}) VALUES {placeholders}"
        self.insert_chunk = self.insert_row + ", " + ", ".join([placeholders] * (_SQLITE_CHUNK - 1))
        self.copy = f"COPY {table.name} ({names}) FROM STDIN (FORMAT BINARY)"
        self.copy_types = [_BINARY_TYPES[type(table.c[name].type)] for name in columns]
        self.ids = {i for i, name in enumerate(columns) if isinstance(table.c[name].type, PredictionId)}

    def __call__(self, c: sa.Connection, rows: Sequence[tuple]) -> None:
        dialect = c.dialect.name
        if self.ids == {0}:  # prediction ids as the dialect stores them (a log row's id leads it)
            rows = [(id_value(row[0], dialect), *row[1:]) for row in rows]
        elif self.ids:
            rows = [tuple(id_value(v, dialect) if i in self.ids else v for i, v in enumerate(row)) for row in rows]
        if dialect == "postgresql" and c.dialect.driver == "psycopg":
            driver_connection = c.connection.driver_connection
            assert driver_connection is not None  # None only once the connection is detached or invalidated
            with driver_connection.cursor() as cursor, cursor.copy(self.copy) as copy:
                copy.set_types(self.copy_types)
                for row in rows:
                    copy.write_row(row)
        elif dialect == "sqlite":
            full = len(rows) - len(rows) % _SQLITE_CHUNK
            for start in range(0, full, _SQLITE_CHUNK):
                c.exec_driver_sql(
                    self.insert_chunk, tuple(v for row in rows[start : start + _SQLITE_CHUNK] for v in row)
                )
            if full < len(rows):
                c.exec_driver_sql(self.insert_row, list(rows[full:]))
        else:
            c.execute(self.table.insert(), [dict(zip(self.columns, row)) for row in rows])
