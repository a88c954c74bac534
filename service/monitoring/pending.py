"""The loop that joins pending labels (``service.store.pending``) to their predictions every ``interval`` seconds,
and at once when the prediction log wrote rows while labels were pending; one pass at a time across replicas."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

import anyio

from service.background import BackgroundLoop
from service.errors import StorageUnavailable
from service.monitoring.labels import LabelRecorder

log = logging.getLogger("service.feedback")


@dataclass(eq=False)
class PendingJoiner(BackgroundLoop):
    name = "pending-labels"

    recorder: LabelRecorder
    _: KW_ONLY
    horizon: float
    interval: float
    on_stored: Callable[[int], None] = lambda n: None

    def __post_init__(self) -> None:
        self.waiting = 0  # pending labels in the store at the last pass (or after this replica stored some)
        super().__init__()

    def predictions_written(self) -> None:
        """The prediction log wrote rows: join at once if labels were waiting."""
        if self.waiting:
            self._wakeup.set()

    def labels_pending(self, n: int) -> None:
        """This replica stored ``n`` pending labels."""
        self.waiting += n

    async def _loop(self) -> None:
        backoff = self.interval
        while self._running:
            await self._wait(backoff)
            try:
                await self.run_pass()
                backoff = self.interval
            except StorageUnavailable:
                backoff = min(backoff * 2, 5.0)
            except Exception:  # noqa: BLE001 - a bug must not end the loop; the next pass tries again
                log.exception("joining pending labels failed")

    async def run_pass(self) -> int:
        """Join what can be joined now, in passes of at most the store's limit; the labels joined."""
        joined = 0
        while True:
            done = await anyio.to_thread.run_sync(self.recorder.join_pending, self.horizon)
            if done is None:  # another replica is joining
                return joined
            self.waiting = done.pending
            joined += len(done.joined)
            if done.joined:
                self.on_stored(len(done.joined))
            if not done.joined and not done.rejected:
                return joined
