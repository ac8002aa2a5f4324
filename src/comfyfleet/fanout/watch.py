"""Which prompts wait for which tasks, and what happens when a prompt is interrupted.

A task outlives the node that submitted it, so the engine cannot cancel it.
Instead every prompt that submits or collects a task holds it; when a prompt
is interrupted (or cancelled), the tasks it alone held are cancelled, at the
provider too. A task another prompt still waits for keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.engine.context import RunControl
from comfyfleet.fanout.task import Task

log = logging.getLogger(__name__)

#: How often interrupt flags are looked at (they are thread-safe flags, not events).
INTERVAL = 0.05


@dataclass
class _Held:
    control: RunControl
    tasks: set[Task] = field(default_factory=set)


class PromptWatch:
    def __init__(self, cancel: Callable[[list[Task]], Coroutine[Any, Any, None]]) -> None:
        self._cancel = cancel
        self._prompts: dict[str, _Held] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._cancels: set[asyncio.Task[None]] = set()

    def hold(self, task: Task, prompt_id: str, control: RunControl) -> None:
        if task.done:
            return
        task.owners.add(prompt_id)
        held = self._prompts.setdefault(prompt_id, _Held(control))
        if task not in held.tasks:
            held.tasks.add(task)
            # Dropped as it ends, so the watch's beat costs the same for any batch size.
            task.finished.add_done_callback(lambda _f: held.tasks.discard(task))
        if self._watcher is None or self._watcher.done():
            # A clean context: the asking node's would keep its prompt's run (and all
            # its outputs) alive as long as the watcher is kept.
            self._watcher = asyncio.create_task(
                self._watch(), name="fanout-interrupt-watch", context=contextvars.Context()
            )

    def release(self, prompt_id: str, tasks: Iterable[Task]) -> list[Task]:
        """Drop the prompt's hold on `tasks`; returns those no prompt holds any more."""
        held = self._prompts.get(prompt_id)
        orphans = []
        for task in tasks:
            task.owners.discard(prompt_id)
            if held is not None:
                held.tasks.discard(task)
            if not task.owners and not task.done:
                orphans.append(task)
        if held is not None and not held.tasks:
            del self._prompts[prompt_id]
        return orphans

    async def _watch(self) -> None:
        while self._prompts:
            for prompt_id, held in list(self._prompts.items()):
                if held.control.interrupted:
                    self._cancel_later(self.release(prompt_id, list(held.tasks)))
                    self._prompts.pop(prompt_id, None)
                elif not held.tasks:
                    del self._prompts[prompt_id]
            await asyncio.sleep(INTERVAL)

    def _cancel_later(self, tasks: list[Task]) -> None:
        if not tasks:
            return
        log.info("prompt interrupted: cancelling %d remote job(s)", len(tasks))
        cancelling = asyncio.create_task(self._cancel(tasks), name="fanout-cancel")
        self._cancels.add(cancelling)
        cancelling.add_done_callback(self._cancels.discard)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._cancels:
            await asyncio.gather(*self._cancels, return_exceptions=True)
