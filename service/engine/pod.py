"""A pod: one engine process and ``frontends`` front-end processes sharing one HTTP and one gRPC port (SO_REUSEPORT)
and prometheus-client's multiprocess directory, supervised; SIGTERM drains the front-ends, then the engine."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from service.ports import free_port
from service.serving.runtime import cuda_wanted
from service.settings import Settings

log = logging.getLogger("service.engine.pod")
#: Seconds between checks of the children, and the least time between two starts of one child.
POLL, RESTART_BACKOFF = 0.2, 1.0


def frontend_count(settings: Settings) -> int:
    """The pod's front-ends: ``frontends`` as a number, ``auto`` the cores less one, at most 16, where CUDA is wanted
    (the engine owns the GPU and the front-ends keep it fed), else 1."""
    if settings.frontends != "auto":
        return settings.frontends
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(16, cores - 1)) if cuda_wanted(settings.device) else 1


class Pod:
    """The supervisor; ``run`` blocks until SIGTERM or SIGINT and returns the exit code."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.count = frontend_count(settings)
        self.directory = Path(tempfile.mkdtemp(prefix="calib-pod-"))
        self.endpoint = f"ipc://{self.directory / 'engine.sock'}"
        self.metrics = self.directory / "metrics"
        self.metrics.mkdir()
        self.port = settings.port or free_port(settings.host)
        self.grpc_port = settings.grpc_port or free_port(settings.host)
        self.children: dict[str, subprocess.Popen] = {}
        self.started: dict[str, float] = {}
        self._stopping = False

    def env(self, **extra: str) -> dict[str, str]:
        """The children's environment: the pod's, with its command-line settings, ports, size and metrics directory."""
        given = {
            "CALIB_HOST": self.settings.host,
            "CALIB_ARTIFACTS": str(self.settings.artifacts),
            "CALIB_DEVICE": self.settings.device,
            "CALIB_LOG_LEVEL": self.settings.log_level,
        }
        if self.settings.default_model is not None:
            given["CALIB_DEFAULT_MODEL"] = self.settings.default_model
        return dict(
            os.environ,
            **given,
            CALIB_FRONTENDS=str(self.count),
            CALIB_PORT=str(self.port),
            CALIB_GRPC_PORT=str(self.grpc_port),
            PROMETHEUS_MULTIPROC_DIR=str(self.metrics),
            **extra,
        )

    def start(self, name: str) -> None:
        if name == "engine":
            argv = [sys.executable, "-m", "service.engine", "--endpoint", self.endpoint]
            self.children[name] = subprocess.Popen(argv, env=self.env(), preexec_fn=_die_with_parent)
        else:
            argv = [sys.executable, "-m", "service", "--reuse-port"]
            index = name.removeprefix("frontend-")
            env = self.env(CALIB_POD__ENGINE_ENDPOINT=self.endpoint, CALIB_POD__INDEX=index)
            self.children[name] = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)
        self.started[name] = time.monotonic()
        log.info("started %s (pid %d)", name, self.children[name].pid)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.stop())
        self.start("engine")
        for i in range(self.count):
            self.start(f"frontend-{i}")
        log.info(
            "pod: %d front-ends on %s:%d (gRPC %d), engine at %s",
            self.count,
            self.settings.host,
            self.port,
            self.grpc_port,
            self.endpoint,
        )
        while not self._stopping:
            for name, child in list(self.children.items()):
                code = child.poll()
                if code is not None and not self._stopping:
                    from prometheus_client import multiprocess

                    multiprocess.mark_process_dead(child.pid, str(self.metrics))
                    log.warning("%s (pid %d) ended with status %s: starting it again", name, child.pid, code)
                    time.sleep(max(0.0, RESTART_BACKOFF - (time.monotonic() - self.started[name])))
                    self.start(name)
            time.sleep(POLL)
        return self.drain()

    def stop(self) -> None:
        self._stopping = True

    def drain(self) -> int:
        """SIGTERM to the front-ends, then to the engine; 0 when all ended cleanly (or by it, still starting)."""
        codes = {}
        for group in ([n for n in self.children if n != "engine"], ["engine"]):
            for name in group:
                self.children[name].send_signal(signal.SIGTERM)
            for name in group:
                try:
                    codes[name] = self.children[name].wait(self.settings.graceful_shutdown_seconds + 30)
                except subprocess.TimeoutExpired:
                    self.children[name].kill()
                    codes[name] = self.children[name].wait()
        shutil.rmtree(self.directory, ignore_errors=True)
        # a child still starting when drained ends by the signal itself: it had taken no request
        failed = {name: code for name, code in codes.items() if code not in (0, -signal.SIGTERM)}
        if failed:
            log.error("drained with failures: %s", failed)
        return 1 if failed else 0


def _die_with_parent() -> None:
    """In the child: SIGTERM it however the supervisor ends (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
