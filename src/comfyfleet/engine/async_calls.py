"""The async node calls of one run in flight: each started as a task in its node's
context, and each node queued in `ended` once all its calls have ended, so the run's
drive wakes in O(1) however many calls are in flight (wide prompts)."""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from comfyfleet.engine.context import InterruptProcessingException, NodeContext, set_current_node
from comfyfleet.engine.failures import Interrupted, NodeFailure


class AsyncCalls:
    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake  # the drive waits for this when nothing is ready
        self.inflight: dict[str, list[asyncio.Future[Any]]] = {}
        # Nodes whose calls have all ended, in the order they ended.
        self.ended: deque[str] = deque()
        self.returns: dict[str, list[Any]] = {}  # a node's collected returns, not yet taken
        self._tasks: set[asyncio.Future[Any]] = set()

    def resolved(self, value: Any) -> asyncio.Future[Any]:
        """A call that ended before it began (a blocked one)."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(value)
        return done

    def spawn(self, call: Coroutine[Any, Any, Any], context: NodeContext) -> asyncio.Future[Any]:
        """Start `call` as a task that sees `context` as its current node."""
        copied = contextvars.copy_context()
        copied.run(set_current_node, context)
        task = asyncio.create_task(call, context=copied)
        self._tasks.add(task)
        return task

    def track(self, node_id: str, calls: list[asyncio.Future[Any]]) -> None:
        """Queue `node_id` in `ended` (and wake the drive) once all `calls` have ended."""
        self.inflight[node_id] = calls
        left = [call for call in calls if not call.done()]
        if not left:
            self._ended(node_id)
            return
        count = [len(left)]

        def one_ended(_call: asyncio.Future[Any]) -> None:
            count[0] -= 1
            if count[0] == 0:
                self._ended(node_id)

        for call in left:
            call.add_done_callback(one_ended)

    def _ended(self, node_id: str) -> None:
        self.ended.append(node_id)
        self._wake()

    def all_done(self, node_id: str) -> bool:
        return all(call.done() for call in self.inflight[node_id])

    def collect(self, node_id: str) -> None:
        """Take the results of a node's ended calls into `returns` (or raise its failure)."""
        returns = []
        for call in self.inflight.pop(node_id):
            if call.cancelled():
                raise Interrupted(node_id)
            exc = call.exception()
            if isinstance(exc, InterruptProcessingException | asyncio.CancelledError):
                raise Interrupted(node_id)
            if exc is not None:
                raise NodeFailure(node_id, exc, {})
            returns.append(call.result())
        self.returns[node_id] = returns

    @property
    def started_any(self) -> bool:
        return bool(self._tasks)

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def cancel_and_wait(self) -> None:
        self.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.inflight.clear()
