"""Group commit of POST /feedback: requests arriving during a write form the next group, written in one transaction;
each is answered only after that commit, and a failed write fails its whole group."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

import anyio

from service.background import BackgroundLoop
from service.errors import InvalidInput, NotReady
from service.monitoring import Monitor
from service.serving.prediction_log import PredictionLog
from service.store.rows import ANONYMOUS

log = logging.getLogger("service.feedback")


@dataclass(eq=False)
class FeedbackGroupCommit(BackgroundLoop):
    name = "feedback-group-commit"

    monitor: Monitor
    prediction_log: PredictionLog
    _: KW_ONLY
    max_request_items: int
    on_stored: Callable[[int], None] = lambda n: None
    on_pending: Callable[[int], None] = lambda n: None
    max_group_items: int = 4096

    def __post_init__(self) -> None:
        self._pending: deque[tuple[tuple[list, str], asyncio.Future]] = deque()
        super().__init__()

    @property
    def pending(self) -> int:
        """Requests waiting for a write."""
        return len(self._pending)

    async def submit(self, items: list, source: str = ANONYMOUS) -> dict:
        """Store ``items`` sent by ``source`` with their group; the response body once committed."""
        if len(items) > self.max_request_items:
            raise InvalidInput(
                f"holds {len(items)} items; at most {self.max_request_items} are allowed per request", field="items"
            )
        if not self._running:
            raise NotReady("the service is shutting down")
        future = asyncio.get_running_loop().create_future()
        self._pending.append(((items, source), future))
        self._wakeup.set()
        result = await future
        self.on_stored(result["accepted"])
        if result["pending"]:
            self.on_pending(len(result["pending"]))
        return result

    async def _loop(self) -> None:
        while self._pending or self._running:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._write(self._take())

    def _take(self) -> list[tuple[tuple[list, str], asyncio.Future]]:
        """The next group: queued requests in arrival order, up to ``max_group_items`` items."""
        group: list[tuple[tuple[list, str], asyncio.Future]] = []
        size = 0
        while self._pending and (not group or size + len(self._pending[0][0][0]) <= self.max_group_items):
            request, future = self._pending.popleft()
            if not future.done():  # a request cancelled while it waited is not written
                group.append((request, future))
                size += len(request[0])
        return group

    async def _write(self, group: list[tuple[tuple[list, str], asyncio.Future]]) -> None:
        if not group:
            return
        try:
            await self.prediction_log.flush()
            bodies = await anyio.to_thread.run_sync(self.monitor.labels.record_group, [request for request, _ in group])
        except Exception as exc:  # noqa: BLE001 - StorageUnavailable, or a bug (500): nothing is acknowledged
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), body in zip(group, bodies):
            if not future.done():
                future.set_result(body)
