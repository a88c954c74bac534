"""A loop task owned by a service part: started in the lifespan, stopped once it has done the work queued before."""

from __future__ import annotations

import asyncio


class BackgroundLoop:
    """Runs ``self._loop()`` as a task named ``name``; ``stop`` clears ``_running``, wakes the loop and
    waits for it to return. ``loop`` is the event loop it runs on (tests hand it coroutines)."""

    name = "background"

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._running = False

    def start(self) -> None:
        self._running = True
        self.loop = asyncio.get_running_loop()
        self._task = self.loop.create_task(self._loop(), name=self.name)

    async def _wait(self, seconds: float) -> bool:
        """Wait until woken (``_wakeup``, then cleared) or ``seconds`` have passed; whether it was woken."""
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout=seconds)
            woken = True
        except asyncio.TimeoutError:
            woken = False
        self._wakeup.clear()
        return woken

    async def stop(self) -> None:
        self._running = False
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def _loop(self) -> None:
        raise NotImplementedError
