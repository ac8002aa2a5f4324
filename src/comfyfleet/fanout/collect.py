"""Waiting for a collector's tasks: results by slot, a failure policy, a status report.

Waiting is async: the collector awaits the tasks' completion futures, so other
nodes and other prompts keep running. `fail_fast` raises on the first failure
after cancelling the rest of its tasks (queued and running, at the provider
too); `placeholder` lets every task end and puts a placeholder in failed slots.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from comfyfleet.engine.blocker import ExecutionBlocker
from comfyfleet.engine.context import NodeContext
from comfyfleet.errors import ComfyfleetError
from comfyfleet.fanout.service import FanoutService
from comfyfleet.fanout.status import report, sharing, slot_entry
from comfyfleet.fanout.task import UNUSABLE, Task

FAIL_FAST, PLACEHOLDER = "fail_fast", "placeholder"
FAILURE_MODES = [FAIL_FAST, PLACEHOLDER]
#: The shortest time between two progress reports of a collector (the last always goes).
PROGRESS_EVERY = 0.1


class CollectFailed(ComfyfleetError, RuntimeError):
    """A task of a fail_fast collector failed; the message names the slot and the error."""


@dataclass(frozen=True)
class Collected:
    values: list[Any]  # per slot: the result, a placeholder, or a silent blocker
    status: str  # the JSON report


async def collect(
    service: FanoutService,
    slots: list[Task | None],
    mode: str,
    node: NodeContext | None,
    placeholder: Callable[[], Any],
) -> Collected:
    tasks = {slot: task for slot, task in enumerate(slots, 1) if task is not None}
    service.hold(tasks.values(), node)
    key = (node.prompt_id, node.node_id) if node is not None else None
    if key is not None:
        service.collecting[key] = (mode, slots)
    try:
        await _wait(service, tasks, mode, node)
    except asyncio.CancelledError:
        await service.abandon(list(tasks.values()), node)
        raise
    finally:
        if key is not None:
            service.collecting.pop(key, None)
    await service.journal.assign_remote_slots(
        [(t.info.journal_id, slot) for slot, t in tasks.items() if t.info.journal_id]
    )
    values: list[Any] = []
    for task in slots:
        if task is None:
            values.append(ExecutionBlocker(None))  # not connected: downstream is skipped
        elif task.state in UNUSABLE:
            # In a worker thread: a video's placeholder is a file, written on first use.
            values.append(await asyncio.to_thread(placeholder))
        else:
            values.append(task.value)
    redactor = service.vault.redactor()
    shared = sharing(slots)
    entries = [
        slot_entry(slot, task, redactor, shared.get(slot)) for slot, task in enumerate(slots, 1)
    ]
    return Collected(values, report(node.node_id if node else None, mode, entries))


async def _wait(
    service: FanoutService, tasks: dict[int, Task], mode: str, node: NodeContext | None
) -> None:
    total = len(tasks)
    waiting = {task.finished: slot for slot, task in tasks.items()}
    loop = asyncio.get_running_loop()
    shown, shown_at = -1, -math.inf
    while True:
        pending = [future for future in waiting if not future.done()]
        done, now = total - len(pending), loop.time()
        # Results of a batch arrive together: one report per PROGRESS_EVERY says as much
        # to a person as thirty, each of which the client and ComfyUI would have to send.
        if done != shown and (not pending or now - shown_at >= PROGRESS_EVERY):
            _progress(node, done, total)
            shown, shown_at = done, now
        failed = next((s for s, t in sorted(tasks.items()) if t.done and t.state in UNUSABLE), None)
        if mode == FAIL_FAST and failed is not None:
            await _fail_fast(service, tasks, failed, node)
        if not pending:
            return
        # A count held back is shown when its time comes, even if nothing else ends.
        due = None if done == shown else max(0.0, shown_at + PROGRESS_EVERY - now)
        await asyncio.wait(pending, timeout=due, return_when=asyncio.FIRST_COMPLETED)


async def _fail_fast(
    service: FanoutService, tasks: dict[int, Task], failed: int, node: NodeContext | None
) -> None:
    others = [task for task in tasks.values() if not task.done]
    if node is not None:
        others = service.watch.release(node.prompt_id, others)
    await service.cancel(others)
    info = tasks[failed].info
    cancelled = sum(1 for task in others if task.done)
    message = f"slot {failed} {info.state.value}: {info.error_class or 'cancelled'}"
    if info.error:
        message += f": {info.error}"
    if cancelled:
        message += f" ({cancelled} other job(s) cancelled)"
    raise CollectFailed(service.vault.redactor().text(message))


def _progress(node: NodeContext | None, done: int, total: int) -> None:
    # Straight to the prompt's control: ComfyUI's ProgressBar raises when interrupted,
    # and an interrupt is handled here as a cancellation instead.
    if node is not None:
        node.control.report_progress(node.node_id, float(done), float(total), None)
