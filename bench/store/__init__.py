"""Store benchmark (``python -m bench.store``, part of ``make bench``): the prediction log at production volume on
PostgreSQL, the compact partitioned log (v3) against version 2's wide row (v2), each in a fresh database of
``CALIB_BENCH_DATABASE_URL``'s server: bytes (and WAL) per prediction, 1% labelled, at 10 and 1,000 classes, of rows
scored as the service scores them, written through each write path, with every relation's share; rows/s through each
path in rotating rounds; and on logs filled in SQL (``bench.store.logs``), the expiry of a partition and a service's
latencies at two sizes of the log, and /predict p99 under sync logging while another replica's retention runs.

    python -m bench.store [--rows 100000] [--large 10000000] [--rounds 3] [--seconds 5] [--smoke]
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import sqlalchemy as sa

from bench.common import (
    GOAL_COLUMNS,
    PG_ADMIN_URL,
    Benchmark,
    ab_rounds,
    connection,
    flags,
    goal,
    judged,
    measured_by,
    process_cpu_seconds,
    store_url,
    table,
)
from bench.store.logs import CONNECTIONS, EXPIRING_ROWS, MODEL, TEMPERATURE, retention_rounds, scale
from service.store.bulk import BulkInsert
from service.store.schema import PredictionId

BATCH = 1000  # rows per write, as the prediction log writes them under load
LABELLED = 0.01
RATE = 10_000.0  # predictions a second of the rows written, which sets how many share a millisecond
_CLOCK = [time.time()]  # where the next rows' ids begin
SIZE_COLUMNS = "schema classes rows bytes_per_prediction log_heap log_toast log_indexes labels_share other wal".split()
SPEED_COLUMNS = "round schema rows rows_per_s batch_ms database_cpu_us rows_per_database_cpu_s wal_per_row".split()
SCALE_COLUMNS = "log_rows expire_s calibration_p50_ms calibration_p99_ms join_p50_ms join_p99_ms requests".split()
RETENTION_COLUMNS = "round retention predict_rps predict_p99_ms passes".split()


def _served_ids(n: int) -> list[str]:
    """Ids of ``n`` predictions served at ``RATE`` a second from where the previous call ended: each id of its own
    time, as traffic makes them (rows scored in the same millisecond are in random order)."""
    from service.store.rows import prediction_ids

    start = _CLOCK[0]
    _CLOCK[0] += n / RATE
    return [prediction_ids(1, at=start + i / RATE)[0] for i in range(n)]


def scored(n: int, classes: int, seed: int) -> list:
    """``n`` rows of ``MODEL`` as the service logs them (a RAPS set each), ids of traffic at ``RATE`` a second."""
    from service.serving.scoring import score

    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, classes)) * 3
    graph = np.exp(z / TEMPERATURE - (z / TEMPERATURE).max(axis=1, keepdims=True))
    graph = (graph / graph.sum(axis=1, keepdims=True)).astype(np.float32)
    batch = score(z.astype(np.float32), graph, 0, TEMPERATURE, encode=True)
    order = np.argsort(-graph, axis=1)
    mass = np.take_along_axis(graph, order, axis=1).cumsum(axis=1)
    members = np.zeros_like(graph, dtype=bool)
    for i in range(n):
        members[i, order[i, : int(np.searchsorted(mass[i], 0.9)) + 1]] = True
    bits = np.packbits(members, axis=1)
    ids = _served_ids(n)
    return [
        row._replace(id=ids[i], set_members=bits[i].tobytes(), set_coverage=0.9, set_method="raps", set_randomized=True)
        for i, row in enumerate(batch.prediction_rows(MODEL, "1"))
    ]


def label_rows(rows: list, fraction: float, seed: int) -> list:
    """Labels for a ``fraction`` of ``rows``, as the service makes them (the served blobs copied, set fields)."""
    from calibkit import binning
    from service.store.rows import LabelRow

    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(rows), size=max(1, int(len(rows) * fraction)), replace=False)
    edges = binning.equal_width_edges(15)
    out = []
    for i in sorted(chosen):
        r = rows[i]
        p = np.frombuffer(r.probabilities, np.float32)
        y = int(rng.integers(0, len(p)))
        k = int(p.argmax())
        bin_ = int(binning.bin_index(np.array([p[k]]), edges)[0])
        out.append(
            LabelRow(
                r.id, r.model, r.version, 0, y, int(y == k), float(p[k]), bin_, float(-np.log(max(p[y], 1e-12))),
                0.5, time.time(), r.probabilities, r.logits, "anonymous", 1, 3, 0.9, "raps", True, 0.5,
            )
        )  # fmt: skip
    return out


#: The least a logged prediction can cost: its id alone, the table's primary key.
FLOOR = sa.Table("floor_log", sa.MetaData(), sa.Column("id", PredictionId, primary_key=True))


class Written(NamedTuple):
    """One write run: its wall seconds, the CPU seconds of the database's server processes and the WAL it wrote."""

    seconds: float
    database_cpu: float
    wal: int


def _server_load(url: str) -> tuple[dict[int, float], int]:
    """The CPU seconds of every server process of the database at ``url`` (its sessions), and the WAL position."""
    with connection(url) as c:
        pids = [r[0] for r in c.exec_driver_sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]
        wal = int(c.exec_driver_sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").scalar_one())
    cpu = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # a session that ended meanwhile
            cpu[pid] = process_cpu_seconds(pid)
    return cpu, wal


def write(url: str, schema: str, rows: list) -> Written:
    """Write ``rows`` through ``schema``'s write path in batches of ``BATCH`` (the schema made first when missing)."""
    from service.store import Store, legacy

    store = Store(url)
    engine = sa.create_engine(url)
    if schema == "v3":
        store.db.migrate()
    else:
        with engine.begin() as c:
            if schema == "floor":
                FLOOR.create(c, checkfirst=True)
            elif not legacy.present(c):
                legacy.create_version_2(c)
        # version 2's write path: binary COPY of the wide row
        insert = BulkInsert(FLOOR, ["id"]) if schema == "floor" else BulkInsert(legacy.predictions, legacy.FIELDS)

    def batch(part: Sequence) -> None:
        if schema == "v3":
            store.predictions.insert(part)
            return
        with engine.begin() as c:  # version 2 had no temperature; the floor keeps the id alone
            insert(c, [(r.id,) if schema == "floor" else r[: len(legacy.FIELDS)] for r in part])

    batch(rows[:1])  # connections opened, caches filled
    cpu_before, wal_before = _server_load(url)
    start = time.perf_counter()
    for i in range(1, len(rows), BATCH):
        batch(rows[i : i + BATCH])
    seconds = time.perf_counter() - start
    cpu_after, wal_after = _server_load(url)
    store.db.engine.dispose()
    engine.dispose()
    cpu = sum(after - cpu_before.get(pid, 0.0) for pid, after in cpu_after.items())
    return Written(seconds, cpu, wal_after - wal_before)


def _labels(url: str, schema: str, labels: list) -> None:
    """Store ``labels`` as each schema's label path does (one transaction, block sums)."""
    from service.store import legacy
    from service.store.labels import insert_labels

    with connection(url, begin=True) as c:
        (legacy.insert_version_2_labels if schema == "v2" else insert_labels)(c, labels)


def relation_sizes(url: str, schema: str) -> dict:
    """Bytes of the log (heap, TOAST, indexes, over its partitions), of the labels and of the rest."""
    log = "prediction_log" if schema == "v3" else "predictions"
    with connection(url) as c:
        parts = [
            r[0]
            for r in c.exec_driver_sql(
                "SELECT relid::regclass::text FROM pg_partition_tree(%(t)s) WHERE isleaf", {"t": log}
            )
        ] or [log]  # a plain table has no partition tree
        heap = toast = indexes = 0
        for name in parts:
            main, table_size, index_size = c.exec_driver_sql(
                "SELECT pg_relation_size(%(n)s), pg_table_size(%(n)s), pg_indexes_size(%(n)s)", {"n": name}
            ).one()
            heap, toast, indexes = heap + main, toast + table_size - main, indexes + index_size
        labels = c.exec_driver_sql("SELECT pg_total_relation_size('labels')").scalar_one()
        total = c.exec_driver_sql(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r'"
        ).scalar_one()
    return {"log_heap": heap, "log_toast": toast, "log_indexes": indexes, "labels": labels, "total": int(total)}


def sizes(n: int, classes: int) -> list[dict]:
    """Bytes per prediction of both schemas, ``n`` rows of ``classes`` classes, 1% labelled; WAL of the log's writes."""
    rows = scored(n, classes, seed=classes)
    labels = label_rows(rows, LABELLED, seed=1)
    out = []
    for schema in ("v2", "v3"):
        with store_url("postgresql") as url:
            wal = write(url, schema, rows).wal
            _labels(url, schema, labels)
            got = relation_sizes(url, schema)
        log = got["log_heap"] + got["log_toast"] + got["log_indexes"]
        out.append(
            {"schema": schema, "classes": classes, "rows": n, "bytes_per_prediction": got["total"] / n}
            | {key: got[key] / n for key in ("log_heap", "log_toast", "log_indexes")}
            | {"labels_share": got["labels"] / n, "other": (got["total"] - log - got["labels"]) / n, "wal": wal / n}
        )
    return out


def speed(n: int, rounds: int) -> list[dict]:
    """Rows/s of both write paths and of the floor, ``rounds`` rounds of ``n`` rows each, the order rotated by round."""
    schemas = ("v2", "v3", "floor")
    with contextlib.ExitStack() as stack:
        urls = {schema: stack.enter_context(store_url("postgresql")) for schema in schemas}
        for schema, url in urls.items():  # the schemas made, and a warm-up
            write(url, schema, scored(min(n, 2000), 10, seed=99))

        def written(schema: str, i: int) -> dict:
            w = write(urls[schema], schema, scored(n + 1, 10, seed=100 + i))
            return {
                "round": i + 1,
                "schema": schema,
                "rows": n,
                "rows_per_s": n / w.seconds,
                "database_cpu_us": 1e6 * w.database_cpu / n,
                "rows_per_database_cpu_s": n / max(w.database_cpu, 1e-9),
                "wal_per_row": w.wal / n,
            }

        return [row for rows in ab_rounds(schemas, rounds, written, rotate=True) for row in rows.values()]


def measure(args) -> dict:
    smoke = args.smoke
    rows, large, rounds, seconds = (
        (2000, 20_000, 1, 1.0) if smoke else (args.rows, args.large, args.rounds, args.seconds)
    )
    now, blob = time.time(), scored(1, 10, seed=7)[0].probabilities  # the blob of every row filled in SQL
    size_rows = sizes(rows, 10) + sizes(max(rows // 10, 200), 1000)
    speed_rows = speed(rows, rounds)
    logs = (max(large // 100, 1000), large)
    scale_rows = scale(logs, 1 if smoke else 5, 1 if smoke else 5, 20 if smoke else 100, now, blob)
    retention = retention_rounds(rounds, seconds, 2 if smoke else 8, now, blob)
    with connection(PG_ADMIN_URL) as c:
        version = str(c.exec_driver_sql("SHOW server_version").scalar_one())
    return {
        "smoke": smoke,
        "postgresql": version,
        "labelled": LABELLED,
        "batch": BATCH,
        "expiring_rows": EXPIRING_ROWS,
        "sizes": size_rows,
        "speed": speed_rows,
        "scale": scale_rows,
        "retention": retention,
        "seconds": seconds,
        "connections": CONNECTIONS,
    }


def _median(rows: list[dict], key: str, **where) -> float:
    return statistics.median(r[key] for r in rows if all(r[k] == v for k, v in where.items()))


def goals(result: dict) -> list[dict]:
    sizes_ = {(r["schema"], r["classes"]): r for r in result["sizes"]}
    small, large = result["scale"][0], result["scale"][-1]

    def over_v2(key: str, schema: str) -> float:
        return _median(result["speed"], key, schema=schema) / _median(result["speed"], key, schema="v2")

    with_retention = _median(result["retention"], "predict_p99_ms", retention="running")
    without = _median(result["retention"], "predict_p99_ms", retention="none")
    wide = sizes_[("v3", 1000)]
    return judged(
        [
            goal(
                "bytes per logged prediction, 10 classes, tables and indexes, 1% labelled",
                sizes_[("v3", 10)]["bytes_per_prediction"],
                "<= 180",
                f"version 2: {sizes_[('v2', 10)]['bytes_per_prediction']:.0f}",
            ),
            goal(
                "bytes per logged prediction, 1,000 classes, over the probabilities' 4,000 bytes",
                wide["bytes_per_prediction"] / 4000,
                "<= 1.5",
                f"{wide['bytes_per_prediction']:.0f} bytes; version 2: "
                f"{sizes_[('v2', 1000)]['bytes_per_prediction']:.0f}",
            ),
            goal(
                f"expiry of one {result['expiring_rows']:,}-row partition, log at {large['log_rows']:.0e} over "
                f"{small['log_rows']:.0e} rows",
                large["expire_s"] / small["expire_s"],
                "<= 1.2",
                f"{small['expire_s'] * 1000:.0f} ms and {large['expire_s'] * 1000:.0f} ms (medians)",
            ),
            goal(
                "prediction-log rows per CPU second of the PostgreSQL server, compact over version 2, median rounds",
                over_v2("rows_per_database_cpu_s", "v3"),
                ">= 2",
                f"{len(result['speed']) // 3} rounds; the floor (the id alone) over version 2, the most any "
                f"row could reach: {over_v2('rows_per_database_cpu_s', 'floor'):.2f}; one writer's rows/s, both "
                f"sides on this machine: {over_v2('rows_per_s', 'v3'):.2f}",
            ),
            *(
                goal(
                    f"{what} p99, log of the larger over the smaller size",
                    large[key] / small[key],
                    "<= 1.2",
                    f"{small[key]:.1f} and {large[key]:.1f} ms",
                )
                for key, what in (
                    ("calibration_p99_ms", "GET /calibration"),
                    ("join_p99_ms", "label join (single-label POST /feedback)"),
                )
            ),
            goal(
                "/predict p99 under sync logging during retention passes over without, median rounds",
                with_retention / without,
                "<= 1.1",
                f"{without:.1f} and {with_retention:.1f} ms",
            ),
        ]
    )


def render(result: dict) -> str:
    server = result.get("postgresql")
    return "\n".join(
        [
            "# Store benchmark",
            "",
            measured_by("make bench-store", result["machine"], result.get("wall_seconds"))
            + (f" PostgreSQL: {server}, on the same machine." if server else ""),
            "",
            "The prediction log on PostgreSQL (bench/store): the compact, partitioned log of schema version 3 (v3) "
            "against version 2's wide row (v2), each in a fresh database. Bytes per prediction with "
            f"{result['labelled']:.0%} of the predictions labelled, broken down into the log's heap, TOAST and "
            "indexes, the labels (table and indexes) and the rest (block sums, dictionaries); `wal` is the WAL "
            f"written per prediction by the log's writes, in batches of {result['batch']}.",
            "",
            table(result["sizes"], SIZE_COLUMNS),
            "",
            "Each write path in rotating rounds, one writer: its rows/s, and the CPU time of the PostgreSQL "
            "server's processes and the WAL per row, which set how many rows one PostgreSQL takes "
            "(`rows_per_database_cpu_s`: its ceiling per server core); `batch_ms` is the mean time to write one batch, "
            "the log's write latency. `floor` writes the ids alone into a table "
            f"whose primary key they are: what any row costs. Ids are those of traffic at {RATE:,.0f} predictions "
            "a second:",
            "",
            table([r | {"batch_ms": 1000 * result["batch"] / r["rows_per_s"]} for r in result["speed"]], SPEED_COLUMNS),
            "",
            f"Expiry of one partition of {result['expiring_rows']:,} rows (1.2% labelled; seconds of the retention "
            "pass, median of its samples) at two sizes of the rest of the log, and on a service over each of the "
            "two stores, run side by side and asked in alternating rounds, the latency of GET /calibration and of "
            "single-label POST /feedback of stored predictions (`requests` of each):",
            "",
            table(result["scale"], SCALE_COLUMNS),
            "",
            f"Single-row /predict under sync logging, wrk at {result['connections']} connections for "
            f"{result['seconds']:g} s, while another replica's retention passes drop one partition after another "
            "(`passes`), and without:",
            "",
            table(result["retention"], RETENTION_COLUMNS),
            "",
            table(result["goals"], GOAL_COLUMNS),
            "",
        ]
    )


arguments = flags(
    rows=(100_000, "rows of the size and speed runs (10 classes)"),
    large=(10_000_000, "the larger log of the expiry and latency runs"),
    rounds=5,
    seconds=5.0,
)
BENCHMARK = Benchmark(measure, goals, render, arguments)
