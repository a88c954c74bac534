"""``python -m service`` (console script ``calibrated-serve``): serve the model repository with uvicorn, one worker per
process; flags override the ``CALIB_*`` variables, and ``CALIB_FRONTENDS`` > 1 runs a pod (``service.engine.pod``)."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import socket
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from service.settings import Settings

#: Net allocations that start a young-generation pass of the cyclic garbage collector (Python's default is 700):
#: fewer passes on the event loop, cyclic garbage still bounded at a few MB (decision 0014).
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
        from service.app import create_app  # not in a pod's supervisor, which only starts and watches processes

        app = create_app(settings)
    except ValueError as exc:  # a token file that cannot be read or parsed
        print(f"error: {exc}")
        return 2
    # Everything imported so far lives as long as the process: keep it out of the collector's full passes
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    # uvicorn drains on SIGTERM, then raises it again with the handler it found: a drained replica exits 0
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
    # bound here, listening once uvicorn has started the app (create_server): none waits on a front-end still starting
    sockets = None
    if reuse_port:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((settings.host, settings.port))
        sockets = [sock]
    uvicorn.Server(config).run(sockets=sockets)
    return 0
