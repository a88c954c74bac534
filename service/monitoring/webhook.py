"""Alarm transitions POSTed as JSON to ``CALIB_MONITORING__WEBHOOK_URL`` in tasks of their own; failures are counted."""

from __future__ import annotations

import asyncio
import logging

import httpx

from service.metrics import ServiceMetrics

log = logging.getLogger("service.monitoring")


class AlarmWebhook:
    def __init__(self, url: str | None, metrics: ServiceMetrics, timeout: float = 5.0):
        self.url = url
        self.metrics = metrics
        self.timeout = timeout
        self._tasks: set[asyncio.Task] = set()

    def notify(self, transition: dict) -> None:
        """Deliver ``transition`` in the background (nothing without a URL)."""
        if self.url:
            task = asyncio.get_running_loop().create_task(self._post(self.url, transition))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Wait for the deliveries under way."""
        if self._tasks:
            await asyncio.gather(*self._tasks)

    async def _post(self, url: str, transition: dict) -> None:
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.post(url, json={"event": "calibration_alarm_transition", **transition})
                response.raise_for_status()
        except httpx.HTTPError as exc:
            self.metrics.webhook_failures.inc()
            log.error("alarm webhook to %s failed: %s", self.url, exc)
