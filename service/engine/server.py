"""The engine process: the model repository's sessions and one dynamic batcher per model version, behind a ZeroMQ
ROUTER socket.

Each request is submitted to its model's batcher as the in-process service does (``DynamicBatcher``: batches grow
with load, several sessions take batches from one queue, a full queue refuses with ``Overloaded``); its reply
carries the request's rows of the graph's outputs and the batch's facts. Requests are answered as their batches
finish, in any order: the front-end routes a reply by its sequence number. Pings are answered at once, so a
front-end can tell a live engine from a dead or stuck one.

    python -m service.engine --endpoint ipc:///run/calib/engine.sock [--artifacts artifacts]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import signal
from collections.abc import Mapping
from typing import cast

import zmq
import zmq.asyncio

from service.engine import wire
from service.errors import ModelNotFound, NotReady, Overloaded
from service.serving.batching import DynamicBatcher

log = logging.getLogger("service.engine")
#: Messages read at once, without waiting, after each awaited one.
DRAIN = 256


class EngineServer:
    """Serves ``batchers`` (by (model, version)) on ``endpoint`` until ``stop``; ``facts`` (by the same keys) are
    what a ``describe`` request learns of each: its provider and sessions, as ``runtime_facts`` gives them."""

    def __init__(
        self,
        batchers: Mapping[tuple[str, str], DynamicBatcher],
        endpoint: str,
        facts: Mapping[tuple[str, str], dict] | None = None,
    ):
        self.batchers = dict(batchers)
        self.endpoint = endpoint
        self.facts = json.dumps([{"model": m, "version": v} | f for (m, v), f in (facts or {}).items()])
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    async def serve(self) -> None:
        """Bind, start the batchers, answer until ``stop``; then finish what is queued and in flight."""
        context = zmq.asyncio.Context.instance()
        socket = context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 1000)
        socket.bind(self.endpoint)
        for batcher in self.batchers.values():
            batcher.start()
        log.info("engine serving %d model versions on %s", len(self.batchers), self.endpoint)
        receive = asyncio.ensure_future(socket.recv_multipart())
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            while True:
                await asyncio.wait({receive, stop}, return_when=asyncio.FIRST_COMPLETED)
                if receive.done():
                    identity, *frames = receive.result()
                    self._answer(socket, identity, frames)
                    # drain what else has arrived without a round through the event loop per message
                    for _ in range(DRAIN):
                        ready = cast(asyncio.Future, socket.recv_multipart(flags=zmq.NOBLOCK))  # done at once
                        if not ready.done() or ready.exception() is not None:  # zmq.Again: nothing waiting
                            break
                        identity, *frames = ready.result()
                        self._answer(socket, identity, frames)
                    receive = asyncio.ensure_future(socket.recv_multipart())
                if stop.done():
                    break
        finally:
            receive.cancel()
            for batcher in self.batchers.values():
                await batcher.stop()
            if self._tasks:
                await asyncio.wait(self._tasks)
            socket.close()

    def stop(self) -> None:
        self._stopping.set()

    def _answer(self, socket, identity: bytes, frames: list) -> None:
        try:
            header, x = wire.read_request(frames)
        except Exception as exc:  # noqa: BLE001 - a malformed message must not stop the engine
            log.warning("dropped a malformed request: %s", exc)
            return
        if header.kind == "ping":
            socket.send_multipart([identity, *wire.reply(header.seq, {})])
            return
        if header.kind == "describe":
            socket.send_multipart([identity, *wire.described(header.seq, self.facts)])
            return
        task = asyncio.ensure_future(self._infer(socket, identity, header, x))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _infer(self, socket, identity: bytes, header: wire.Request, x) -> None:
        batcher = self.batchers.get((header.model, header.version))
        try:
            if batcher is None:
                raise ModelNotFound(f"the engine serves no model {header.model!r} version {header.version!r}")
            if x is None:
                raise ValueError("an inference request without rows")
            outputs, timing = await batcher.submit(x)
            frames = wire.reply(
                header.seq,
                outputs,
                batch_id=timing.batch_id,
                batch_rows=timing.batch_rows,
                queue_seconds=timing.queue_seconds,
                inference_seconds=timing.inference_seconds,
            )
        except Overloaded as exc:
            frames = wire.failure(header.seq, "overloaded", exc.message, int(exc.headers["Retry-After"]))
        except NotReady as exc:
            frames = wire.failure(header.seq, "not_ready", exc.message, 1)
        except ModelNotFound as exc:
            frames = wire.failure(header.seq, "model_not_found", exc.message)
        except ValueError as exc:
            frames = wire.failure(header.seq, "invalid", str(exc))
        except Exception as exc:  # noqa: BLE001 - every request gets an answer
            log.exception("inference failed for %s %s", header.model, header.version)
            frames = wire.failure(header.seq, "error", f"{type(exc).__name__}: {exc}")
        await socket.send_multipart([identity, *frames])


def runtime_facts(runtimes) -> dict:
    """What a front-end shows of a version's sessions (``/health``, ``provider`` in answers, the v2 outputs)."""
    first = runtimes[0]
    return {
        "provider": first.provider,
        "requested": list(first.requested),
        "io_binding": first.io_binding,
        "buckets": list(first.buckets),
        "bucket_sessions": bool(first.bucket_sessions),
        "sessions": len(runtimes),
        "output_names": list(first.output_names),
    }


def repository_engine(settings) -> tuple[dict[tuple[str, str], DynamicBatcher], dict[tuple[str, str], dict]]:
    """A batcher over the raw graph outputs of every version the repository loads (sessions, buckets, warm-up), and
    the facts of its sessions."""
    from service.metrics import ServiceMetrics
    from service.serving.repository import ModelRepository

    repository = ModelRepository(settings)
    repository.load()
    metrics = ServiceMetrics()  # in a pod, its multiprocess files join the front-ends' /metrics
    batchers = {
        (m.name, m.version): DynamicBatcher(
            [runtime.run for runtime in m.runtimes],
            m.batching,
            f"{m.name}:{m.version}",
            settings.retry_after_seconds,
            on_batch=functools.partial(metrics.observe_batch, f"{m.name}:{m.version}"),
        )
        for m in repository.all()
    }
    return batchers, {(m.name, m.version): runtime_facts(m.runtimes) for m in repository.all()}


async def _main(endpoint: str, settings) -> None:
    batchers, facts = repository_engine(settings)
    server = EngineServer(batchers, endpoint, facts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop)
    await server.serve()


def main(argv: list[str] | None = None) -> None:
    from service.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m service.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="ZeroMQ endpoint to bind, e.g. ipc:///tmp/engine.sock")
    parser.add_argument("--artifacts", help="model repository (default: CALIB_ARTIFACTS or ./artifacts)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings(**({"artifacts": args.artifacts} if args.artifacts else {}))
    asyncio.run(_main(args.endpoint, settings))
