"""Store benchmark (``python -m bench.store``, part of ``make bench``): the prediction log at production volume on
PostgreSQL, the compact partitioned log against the schema of version 2, each in a fresh database of the server of
``CALIB_BENCH_DATABASE_URL``.

- Bytes per prediction, 1% labelled, at 10 and at 1,000 classes: rows scored as the service scores them (temperature
  scaling, a RAPS set on every row) written through the store's write path (``Predictions.insert``; version 2: its
  binary COPY of the wide row), then every relation's size: the log's heap, TOAST and each index, the labels' share.
  WAL bytes per prediction of the same writes.
- Rows/s into one PostgreSQL through each write path, in alternating rounds.
- The time to expire one partition of fixed size (100,000 rows, 1% labelled) with the rest of the log at 10^5 and
  at 10^7 rows (filled in SQL), and with the service on each of those stores: GET /calibration and the label join
  (single-label POST /feedback of stored predictions) latencies.
- /predict p99 under ``CALIB_PREDICTION_LOG__DURABILITY=sync``, while another replica's retention passes expire a
  partition after another, against the same without them, in alternating rounds.

    python -m bench.store [--rows 100000] [--large 10000000] [--rounds 3] [--seconds 5] [--smoke]
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, cast

import httpx
import numpy as np
import sqlalchemy as sa

from bench.common import (
    GOAL_COLUMNS,
    PG_ADMIN_URL,
    ROOT,
    Benchmark,
    Server,
    ab_rounds,
    goal,
    judged,
    measured_by,
    process_cpu_seconds,
    service,
    store_url,
    table,
    wrk,
)
from service.store.bulk import BulkInsert
from service.store.schema import PredictionId

MODEL = "digits-lenet5"
TEMPERATURE = 1.8378208850397053  # the default artifact's
DAY = 86400.0
BATCH = 1000  # rows per write, as the prediction log writes them under load
LABELLED = 0.01
CONNECTIONS = 32
EXPIRING_ROWS = 100_000
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
    """``n`` prediction rows of model ``MODEL`` as the service logs them: probabilities under the artifact's
    temperature (float32), logits, a RAPS set (the classes holding 90% of the mass) on every row, and the ids of
    traffic at ``RATE`` predictions a second."""
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


def _v2_writer():
    """Version 2's write path: binary COPY of the wide row."""
    from service.store import legacy
    from service.store.bulk import BulkInsert

    return BulkInsert(legacy.predictions, legacy.FIELDS)


class Written(NamedTuple):
    """One write run: its wall seconds, the CPU seconds of the database's server processes and the WAL it wrote."""

    seconds: float
    database_cpu: float
    wal: int


def _server_load(url: str) -> tuple[dict[int, float], int]:
    """The CPU seconds of every server process of the database at ``url`` (its sessions), and the WAL position."""
    engine = sa.create_engine(url)
    with engine.connect() as c:
        pids = [r[0] for r in c.exec_driver_sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]
        wal = int(c.exec_driver_sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").scalar_one())
    engine.dispose()
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
        insert = BulkInsert(FLOOR, ["id"]) if schema == "floor" else _v2_writer()

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

    engine = sa.create_engine(url)
    with engine.begin() as c:
        if schema == "v2":
            legacy.insert_version_2_labels(c, labels)
        else:
            insert_labels(c, labels)
    engine.dispose()


def relation_sizes(url: str, schema: str) -> dict:
    """Bytes of the log's heap, TOAST and indexes (over its partitions), of the labels (table and indexes) and of the
    rest (block sums, dictionaries, state tables)."""
    log = "prediction_log" if schema == "v3" else "predictions"
    engine = sa.create_engine(url)
    with engine.connect() as c:
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
    engine.dispose()
    return {"log_heap": heap, "log_toast": toast, "log_indexes": indexes, "labels": labels, "total": int(total)}


def sizes(n: int, classes: int, work: Path) -> list[dict]:
    """Bytes per prediction of both schemas, ``n`` rows of ``classes`` classes, 1% labelled; WAL of the log's writes."""
    rows = scored(n, classes, seed=classes)
    labels = label_rows(rows, LABELLED, seed=1)
    out = []
    for schema in ("v2", "v3"):
        with store_url("postgresql", work) as url:
            wal = write(url, schema, rows).wal
            _labels(url, schema, labels)
            got = relation_sizes(url, schema)
        log = got["log_heap"] + got["log_toast"] + got["log_indexes"]
        out.append(
            {
                "schema": schema,
                "classes": classes,
                "rows": n,
                "bytes_per_prediction": got["total"] / n,
                "log_heap": got["log_heap"] / n,
                "log_toast": got["log_toast"] / n,
                "log_indexes": got["log_indexes"] / n,
                "labels_share": got["labels"] / n,
                "other": (got["total"] - log - got["labels"]) / n,
                "wal": wal / n,
            }
        )
    return out


def speed(n: int, rounds: int, work: Path) -> list[dict]:
    """Rows/s of both write paths and of the floor, ``rounds`` rounds of ``n`` rows into one database each, in an
    order rotated by round."""
    schemas = ("v2", "v3", "floor")
    with contextlib.ExitStack() as stack:
        urls = {schema: stack.enter_context(store_url("postgresql", work)) for schema in schemas}
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


def _fill_sql(url: str, key_id: int, start: float, end: float, n: int, blob: bytes) -> None:
    """``n`` log rows of key ``key_id`` with ids spread over [start, end), written by PostgreSQL itself, and labels for
    about 1.2% of them (those whose first random byte is below 3), with their block sums rebuilt."""
    from service.store import partitions
    from service.store.blocks import add_to_blocks, block_sums
    from service.store.schema import label_bins

    probs = np.frombuffer(blob, np.float32)
    k = int(probs.argmax())
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.exec_driver_sql("SET LOCAL statement_timeout = 0")
        partitions.create(c, start, end)
        c.exec_driver_sql(
            "INSERT INTO prediction_log (id, key, offline, probabilities) "
            "SELECT (lpad(to_hex(%(start)s::bigint + g::bigint * %(span)s::bigint / %(n)s::bigint), 12, '0') "
            "|| lpad(to_hex((random() * 1099511627775)::bigint), 10, '0') "
            "|| lpad(to_hex((random() * 1099511627775)::bigint), 10, '0'))::uuid, %(key)s, false, %(blob)s "
            "FROM generate_series(0, %(n)s - 1) g",
            {"start": int(start * 1000), "span": int((end - start) * 1000), "n": n, "key": key_id, "blob": blob},
        )
        c.exec_driver_sql(
            "INSERT INTO labels (prediction_id, model, version, calibration_version, label, correct, confidence, "
            "conf_bin, nll, brier, labelled_at, probabilities, source) "
            "SELECT id, %(model)s, '1', 0, %(k)s, 1, %(p)s, 14, 0.1, 0.05, "
            "extract(epoch FROM now()), %(blob)s, 'anonymous' FROM prediction_log "
            "WHERE id >= %(lo)s AND id < %(hi)s AND get_byte(uuid_send(id), 6) < 3",
            {
                "model": MODEL,
                "k": k,
                "p": float(probs[k]),
                "blob": blob,
                "lo": partitions.bound(start),
                "hi": partitions.bound(end),
            },
        )
        c.execute(label_bins.delete())
        add_to_blocks(c, block_sums(sa.true()))
    engine.dispose()


def _settle(url: str) -> None:
    """The store as one that grew row by row over days is: vacuumed and analyzed (autovacuum's work, which a bulk
    fill leaves to do), its dirty pages written (a checkpoint), so the timings that follow are not a bulk load's."""
    engine = sa.create_engine(url)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql("SET statement_timeout = 0")
        c.exec_driver_sql("VACUUM ANALYZE")
        c.exec_driver_sql("CHECKPOINT")
    engine.dispose()


def _partitions(url: str, start: float, end: float) -> None:
    """Make the partitions of [start, end) beforehand."""
    from service.store import partitions

    engine = sa.create_engine(url)
    with engine.begin() as c:
        partitions.create(c, start, end)
    engine.dispose()


def _key_id(url: str) -> int:
    from service.store import Store
    from service.store.rows import CalibrationKey

    store = Store(url)
    store.db.migrate()
    key = CalibrationKey(MODEL, "1", 0)
    found = store.predictions.dictionaries.key_ids([(key, TEMPERATURE)])[key]
    store.db.engine.dispose()
    return found


def _latencies(client: httpx.Client, requests: list) -> list[float]:
    out = []
    for method, path, body in requests:
        start = time.perf_counter()
        client.request(method, path, json=body).raise_for_status()
        out.append(1000 * (time.perf_counter() - start))
    return out


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else math.nan


def _store_of(rest: int, samples: int, url: str, now: float) -> list[float]:
    """Fill the store at ``url``: ``samples`` partitions of ``EXPIRING_ROWS`` rows 35, 34, ... days old and ``rest``
    rows over the last 20 days (1.2% labelled); then expire the old ones, a pass each: the passes' seconds."""
    from service.store import Store, partitions

    blob = scored(1, 10, seed=7)[0].probabilities
    key_id = _key_id(url)
    first = (math.floor(now / DAY) - 35) * DAY
    for day in range(samples):
        _fill_sql(url, key_id, first + day * DAY, first + (day + 1) * DAY, EXPIRING_ROWS, blob)
    _fill_sql(url, key_id, now - 20 * DAY, now - 60, rest, blob)
    _partitions(url, first, first + (samples + 30 + partitions.AHEAD + 1) * DAY)  # none made in a timed pass
    _settle(url)
    store = Store(url)
    expire = []
    for day in range(samples):
        start = time.perf_counter()
        done = store.upkeep(retention_seconds=30 * DAY, now=first + (day + 1) * DAY + 30 * DAY)  # day ``day`` ends
        expire.append(time.perf_counter() - start)
        assert done is not None and len(done.dropped) == 1, done
    store.db.engine.dispose()
    _steady_shift_state(url)
    return expire


def scale(sizes: tuple[int, ...], samples: int, rounds: int, requests: int, work: Path, now: float) -> list[dict]:
    """Per size of the rest of the log: the expiry of a partition of fixed size (``samples`` passes), then, with a
    service over each store, all at once, GET /calibration and single-label POST /feedback of stored predictions,
    ``requests`` of each per store and round, the stores in turn."""
    out = []
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(store_url("postgresql", work)) for _ in sizes]
        expire = [_store_of(rest, samples, url, now) for rest, url in zip(sizes, urls)]
        ids = [_unlabelled_ids(url, rounds * requests + 5) for url in urls]
        servers = [_service(url) for url in urls]
        for server in servers:
            stack.callback(server.stop)
        clients = [stack.enter_context(httpx.Client(base_url=server.url, timeout=120)) for server in servers]
        for client, pool in zip(clients, ids):
            deadline = time.monotonic() + 600  # the evaluator folds the labels filled in SQL before it is measured
            while client.get("/calibration").json()["e_detector"]["labels_pending"]:
                assert time.monotonic() < deadline, "the service did not fold the stored labels"
                time.sleep(1.0)
            _latencies(client, [("GET", "/calibration", None)] * 5 + _feedback(pool[:5]))
        calibration: list[list[float]] = [[] for _ in sizes]
        joins: list[list[float]] = [[] for _ in sizes]

        def latencies(k: int, r: int) -> None:
            calibration[k].extend(_latencies(clients[k], [("GET", "/calibration", None)] * requests))
            joins[k].extend(_latencies(clients[k], _feedback(ids[k][5 + r * requests : 5 + (r + 1) * requests])))

        ab_rounds(range(len(sizes)), rounds, latencies)
    for k, rest in enumerate(sizes):
        out.append(
            {
                "log_rows": rest,
                "expire_s": statistics.median(expire[k]),
                "expire_all_s": expire[k],
                "calibration_p50_ms": _quantile(calibration[k], 0.5),
                "calibration_p99_ms": _quantile(calibration[k], 0.99),
                "join_p50_ms": _quantile(joins[k], 0.5),
                "join_p99_ms": _quantile(joins[k], 0.99),
                "requests": len(joins[k]),
            }
        )
    return out


def _unlabelled_ids(url: str, n: int) -> list[str]:
    """``n`` of the newest stored predictions without a label (those whose first random byte is 3 or more)."""
    engine = sa.create_engine(url)
    with engine.connect() as c:
        query = "SELECT id FROM prediction_log WHERE get_byte(uuid_send(id), 6) >= 3 ORDER BY id DESC LIMIT %(n)s"
        ids = [r[0].hex for r in c.exec_driver_sql(query, {"n": n})]
    engine.dispose()
    return ids


def _feedback(ids: list[str]) -> list:
    return [("POST", "/feedback", {"items": [{"prediction_id": i, "label": 3}]}) for i in ids]


def _steady_shift_state(url: str) -> None:
    """The label-shift alarm's state as a service that has been serving all along leaves it: folded up to the newest
    prediction (the log filled in SQL has no alarm behind it, which would otherwise fold it all from the start)."""
    from calibkit.label_shift_alarm import LabelShiftAlarmState
    from calibkit.manifest import load_manifest
    from service.monitoring.shift_alarm import alarm_config
    from service.settings import ShiftSettings
    from service.store import Store
    from service.store.rows import CalibrationKey

    reference = load_manifest(ROOT / "artifacts" / MODEL / "1" / "manifest.json").label_shift
    assert reference is not None, "the default artifact has its label_shift entry"
    config = alarm_config(reference, ShiftSettings())
    store = Store(url)
    with store.shift_states.locked(CalibrationKey(MODEL, "1", 0), json.dumps({})) as locked:
        locked.save(
            cursor=_newest_id(locked.connection),
            state=json.dumps(LabelShiftAlarmState.fresh(config).to_dict()),
            alarmed=False,
            since=None,
            priors=None,
        )
    store.db.engine.dispose()


def _newest_id(c) -> str:
    return c.exec_driver_sql("SELECT id FROM prediction_log ORDER BY id DESC LIMIT 1").scalar_one().hex


def _service(url: str, durability: str = "async") -> Server:
    """The service over the committed artifacts and the store at ``url``, whose own upkeep expires nothing (the
    benchmark's passes do)."""
    return service(
        ROOT / "artifacts", url, CALIB_STORE__RETENTION_DAYS="3650", CALIB_PREDICTION_LOG__DURABILITY=durability
    )


def retention_rounds(rounds: int, seconds: float, passes: int, work: Path, now: float) -> list[dict]:
    """/predict p99 under sync logging with another replica's retention passes running (each expiring one partition
    of ``EXPIRING_ROWS`` rows, ``passes`` a round at most) and without, ``rounds`` times, alternately first."""
    from service.store import Store, partitions
    from training.data import load_digits_splits

    blob = scored(1, 10, seed=7)[0].probabilities
    body = json.dumps({"inputs": load_digits_splits().test.x[:1].tolist()})
    with store_url("postgresql", work) as url:
        key_id = _key_id(url)
        first = math.floor(now / DAY) - 35 - rounds * passes
        for day in range(rounds * passes):
            _fill_sql(url, key_id, (first + day) * DAY, (first + day + 1) * DAY, EXPIRING_ROWS, blob)
        _fill_sql(url, key_id, now - 20 * DAY, now - 60, EXPIRING_ROWS, blob)
        _partitions(url, first * DAY, (first + rounds * passes + 30 + partitions.AHEAD + 1) * DAY)
        _settle(url)
        server = _service(url, "sync")
        other = Store(url)
        expired = 0

        def predict(retention: bool, i: int) -> dict:
            stop, done = threading.Event(), cast(list, [])

            def passes_while_running() -> None:
                nonlocal expired
                while not stop.is_set() and len(done) < passes:
                    done.append(other.upkeep(retention_seconds=30 * DAY, now=(first + expired + 1) * DAY + 30 * DAY))
                    expired += 1

            thread = threading.Thread(target=passes_while_running)
            if retention:
                thread.start()
            run = wrk(f"{server.url}/predict", body, CONNECTIONS, seconds)
            stop.set()
            if retention:
                thread.join()
            return {
                "round": i + 1,
                "retention": "running" if retention else "none",
                "predict_rps": run["requests_per_s"],
                "predict_p99_ms": run["p99_ms"],
                "passes": len(done),
            }

        try:
            wrk(f"{server.url}/predict", body, CONNECTIONS, 1.0)
            out = [row for rows in ab_rounds((False, True), rounds, predict) for row in rows.values()]
        finally:
            server.stop()
            other.db.engine.dispose()
    return out


def arguments(parser) -> None:
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the size and speed runs (10 classes)")
    parser.add_argument("--large", type=int, default=10_000_000, help="the larger log of the expiry and latency runs")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)


def measure(args) -> dict:
    smoke = args.smoke
    rows, large, rounds, seconds = (
        (2000, 20_000, 1, 1.0) if smoke else (args.rows, args.large, args.rounds, args.seconds)
    )
    work = Path(tempfile.mkdtemp(prefix="calib-bench-store-"))
    now = time.time()
    try:
        size_rows = sizes(rows, 10, work) + sizes(max(rows // 10, 200), 1000, work)
        speed_rows = speed(rows, rounds, work)
        logs = (max(large // 100, 1000), large)
        scale_rows = scale(logs, 1 if smoke else 5, 1 if smoke else 5, 20 if smoke else 100, work, now)
        retention = retention_rounds(rounds, seconds, 2 if smoke else 8, work, now)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "smoke": smoke,
        "postgresql": _server_version(),
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


def _server_version() -> str:
    engine = sa.create_engine(PG_ADMIN_URL)
    with engine.connect() as c:
        version = c.exec_driver_sql("SHOW server_version").scalar_one()
    engine.dispose()
    return str(version)


def _median(rows: list[dict], key: str, **where) -> float:
    return statistics.median(r[key] for r in rows if all(r[k] == v for k, v in where.items()))


def goals(result: dict) -> list[dict]:
    sizes_ = {(r["schema"], r["classes"]): r for r in result["sizes"]}
    small, large = result["scale"][0], result["scale"][-1]
    speed_ratio = _median(result["speed"], "rows_per_database_cpu_s", schema="v3") / _median(
        result["speed"], "rows_per_database_cpu_s", schema="v2"
    )
    floor_ratio = _median(result["speed"], "rows_per_database_cpu_s", schema="floor") / _median(
        result["speed"], "rows_per_database_cpu_s", schema="v2"
    )
    client_ratio = _median(result["speed"], "rows_per_s", schema="v3") / _median(
        result["speed"], "rows_per_s", schema="v2"
    )
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
                speed_ratio,
                ">= 2",
                f"{len(result['speed']) // 3} rounds; the floor (the id alone) over version 2, the most any "
                f"row could reach: {floor_ratio:.2f}; one writer's rows/s, both sides on this machine: "
                f"{client_ratio:.2f}",
            ),
            goal(
                "GET /calibration p99, log of the larger over the smaller size",
                large["calibration_p99_ms"] / small["calibration_p99_ms"],
                "<= 1.2",
                f"{small['calibration_p99_ms']:.1f} and {large['calibration_p99_ms']:.1f} ms",
            ),
            goal(
                "label join (single-label POST /feedback) p99, log of the larger over the smaller size",
                large["join_p99_ms"] / small["join_p99_ms"],
                "<= 1.2",
                f"{small['join_p99_ms']:.1f} and {large['join_p99_ms']:.1f} ms",
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


BENCHMARK = Benchmark(measure, goals, render, arguments)
