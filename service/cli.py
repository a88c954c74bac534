"""``python -m service`` (console script ``calibrated-serve``): serve the model repository with uvicorn.

Flags override the ``CALIB_*`` environment variables. One worker per process: scale with replicas (each process
batches its own traffic and exposes its own /metrics), or, with ``CALIB_FRONTENDS`` > 1, run a pod of front-end
processes around one engine process on the same ports (``service.engine.pod``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import socket
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from service.app import create_app
from service.settings import Settings

#: Net allocations of container objects that start a young-generation pass of Python's cyclic garbage collector
#: (Python's default is 700). Each pass runs on the event loop, so fewer passes leave it more time for requests;
#: request objects are freed by reference counting long before, so this bounds cyclic garbage at a few MB
#: (decision 0014).
GC_THRESHOLD = 10_000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, help="model repository (default ./artifacts, env CALIB_ARTIFACTS)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1, env CALIB_HOST)")
    parser.add_argument("--port", type=int, help="port (default 8000, env CALIB_PORT)")
    parser.add_argument("--default-model", help="model served when a request names none")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="execution provider choice")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    # a pod's front-end: a listening socket of its own on the pod's port (SO_REUSEPORT)
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reuse_port = args.reuse_port
    overrides = {k: v for k, v in vars(args).items() if v is not None and k != "reuse_port"}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        print(f"error: invalid settings: {exc}")
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from service.engine.pod import Pod, frontend_count

    if frontend_count(settings) > 1 and settings.pod.index is None:
        return Pod(settings).run()
    try:
        app = create_app(settings)
    except ValueError as exc:  # a token file that cannot be read or parsed
        print(f"error: {exc}")
        return 2
    # Everything imported so far lives as long as the process: keep it out of the cyclic garbage
    # collector's full passes, which otherwise stall a request for tens of milliseconds now and then,
    # and run its young passes less often (``GC_THRESHOLD``).
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    # uvicorn drains on SIGTERM, restores the handler it found and raises the signal again, so that the process
    # would end killed by it; a drained replica has done nothing wrong, so it is absorbed here and the exit is 0
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        log_level=settings.log_level,
        # uvicorn's annotation says int, but it only hands the value to asyncio.wait_for, which takes a float
        timeout_graceful_shutdown=settings.graceful_shutdown_seconds,  # type: ignore[arg-type]
        access_log=False,
    )
    # a pod's front-ends each listen on the pod's port with SO_REUSEPORT, so that the kernel spreads the connections
    # over them evenly (on one shared listening socket, the front-end that wakes first accepts them all)
    sockets = None
    if reuse_port:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        sockets = [socket.create_server((settings.host, settings.port), family=family, backlog=2048, reuse_port=True)]
    uvicorn.Server(config).run(sockets=sockets)
    return 0
