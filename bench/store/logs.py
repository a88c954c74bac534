"""The store benchmark's logs at scale, filled in SQL: ``scale`` (expiry and service latencies at two sizes of the
log) and ``retention_rounds`` (/predict under sync logging beside another replica's retention)."""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import threading
import time
from typing import cast

import httpx
import numpy as np
import sqlalchemy as sa

from bench.common import ROOT, Server, ab_rounds, connection, service, store_url, wrk

MODEL = "digits-lenet5"
TEMPERATURE = 1.8378208850397053  # the default artifact's
DAY = 86400.0
CONNECTIONS = 32
EXPIRING_ROWS = 100_000


def _fill_sql(url: str, key_id: int, start: float, end: float, n: int, blob: bytes) -> None:
    """``n`` log rows of ``key_id`` with ids over [start, end), written by PostgreSQL itself, about 1.2% labelled."""
    from service.store import partitions
    from service.store.blocks import add_to_blocks, block_sums
    from service.store.schema import label_bins

    probs = np.frombuffer(blob, np.float32)
    k = int(probs.argmax())
    with connection(url, begin=True) as c:
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
            {"model": MODEL, "k": k, "p": float(probs[k]), "blob": blob}
            | {"lo": partitions.bound(start), "hi": partitions.bound(end)},
        )
        c.execute(label_bins.delete())
        add_to_blocks(c, block_sums(sa.true()))


def _filled(url: str, first: int, days: int, rest: int, now: float, blob: bytes) -> None:
    """Fill the store at ``url`` (``days`` expiring partitions, ``rest`` rows over 20 days, 1.2% labelled), then
    vacuum, analyze and checkpoint it, so the timings that follow are not a bulk load's."""
    from service.store import Store, partitions
    from service.store.rows import CalibrationKey

    store = Store(url)
    store.db.migrate()
    key = CalibrationKey(MODEL, "1", 0)
    key_id = store.predictions.dictionaries.key_ids([(key, TEMPERATURE)])[key]
    store.db.engine.dispose()
    for day in range(days):
        _fill_sql(url, key_id, (first + day) * DAY, (first + day + 1) * DAY, EXPIRING_ROWS, blob)
    _fill_sql(url, key_id, now - 20 * DAY, now - 60, rest, blob)
    with connection(url, begin=True) as c:  # none made in a timed pass
        partitions.create(c, first * DAY, (first + days + 30 + partitions.AHEAD + 1) * DAY)
    with connection(url, isolation_level="AUTOCOMMIT") as c:
        for statement in ("SET statement_timeout = 0", "VACUUM ANALYZE", "CHECKPOINT"):
            c.exec_driver_sql(statement)


def _latencies(client: httpx.Client, requests: list) -> list[float]:
    out = []
    for method, path, body in requests:
        start = time.perf_counter()
        client.request(method, path, json=body).raise_for_status()
        out.append(1000 * (time.perf_counter() - start))
    return out


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else math.nan


def _store_of(rest: int, samples: int, url: str, now: float, blob: bytes) -> list[float]:
    """Fill the store at ``url`` with ``samples`` old partitions, then expire them a pass each: the passes' seconds."""
    from service.store import Store

    first = math.floor(now / DAY) - 35
    _filled(url, first, samples, rest, now, blob)
    store = Store(url)
    expire = []
    for day in range(samples):
        start = time.perf_counter()
        done = store.upkeep(retention_seconds=30 * DAY, now=(first + day + 1) * DAY + 30 * DAY)  # day ``day`` ends
        expire.append(time.perf_counter() - start)
        assert done is not None and len(done.dropped) == 1, done
    store.db.engine.dispose()
    _steady_shift_state(url)
    return expire


def scale(sizes: tuple[int, ...], samples: int, rounds: int, requests: int, now: float, blob: bytes) -> list[dict]:
    """Per size of the rest of the log: the expiry of a partition of fixed size, then, with a service over each
    store, GET /calibration and single-label POST /feedback of stored predictions, the stores in turn."""
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(store_url("postgresql")) for _ in sizes]
        expire = [_store_of(rest, samples, url, now, blob) for rest, url in zip(sizes, urls)]
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
    return [
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
        for k, rest in enumerate(sizes)
    ]


def _unlabelled_ids(url: str, n: int) -> list[str]:
    """``n`` of the newest stored predictions without a label (those whose first random byte is 3 or more)."""
    with connection(url) as c:
        query = "SELECT id FROM prediction_log WHERE get_byte(uuid_send(id), 6) >= 3 ORDER BY id DESC LIMIT %(n)s"
        return [r[0].hex for r in c.exec_driver_sql(query, {"n": n})]


def _feedback(ids: list[str]) -> list:
    return [("POST", "/feedback", {"items": [{"prediction_id": i, "label": 3}]}) for i in ids]


def _steady_shift_state(url: str) -> None:
    """The label-shift alarm's state folded up to the newest prediction, as a service serving all along leaves it."""
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
        newest = locked.connection.exec_driver_sql("SELECT id FROM prediction_log ORDER BY id DESC LIMIT 1")
        locked.save(
            cursor=newest.scalar_one().hex,
            state=json.dumps(LabelShiftAlarmState.fresh(config).to_dict()),
            alarmed=False,
            since=None,
            priors=None,
        )
    store.db.engine.dispose()


def _service(url: str, durability: str = "async") -> Server:
    """The service over the committed artifacts and the store at ``url``; only the benchmark's passes expire."""
    return service(
        ROOT / "artifacts", url, CALIB_STORE__RETENTION_DAYS="3650", CALIB_PREDICTION_LOG__DURABILITY=durability
    )


def retention_rounds(rounds: int, seconds: float, passes: int, now: float, blob: bytes) -> list[dict]:
    """/predict p99 under sync logging with another replica's retention passes running (each expiring one partition
    of ``EXPIRING_ROWS`` rows, ``passes`` a round at most) and without, ``rounds`` times, alternately first."""
    from service.store import Store
    from training.data import load_digits_splits

    body = json.dumps({"inputs": load_digits_splits().test.x[:1].tolist()})
    with store_url("postgresql") as url:
        first = math.floor(now / DAY) - 35 - rounds * passes
        _filled(url, first, rounds * passes, EXPIRING_ROWS, now, blob)
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
            return [row for rows in ab_rounds((False, True), rounds, predict) for row in rows.values()]
        finally:
            server.stop()
            other.db.engine.dispose()
