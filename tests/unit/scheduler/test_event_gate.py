"""A slot's next job may start before the last one's end is written; its events wait."""

from __future__ import annotations

import asyncio
import functools

from comfyfleet.scheduler.attempts import EventGate


async def test_events_wait_for_the_previous_job_then_keep_their_order() -> None:
    previous: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    gate = EventGate(previous)
    seen: list[str] = []
    for name in ("execution_start", "executing", "progress"):
        gate.pass_on(functools.partial(seen.append, name))
    await asyncio.sleep(0)
    assert seen == [] and not gate.opened.is_set()

    previous.set_result(None)  # the previous job has sent its done signal
    await asyncio.sleep(0)
    assert seen == ["execution_start", "executing", "progress"]
    assert gate.opened.is_set()
    gate.pass_on(lambda: seen.append("executed"))  # from now on, straight through
    assert seen[-1] == "executed"


async def test_a_failed_or_missing_previous_job_holds_nothing_back() -> None:
    seen: list[str] = []
    EventGate(None).pass_on(lambda: seen.append("first"))
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("its end could not be recorded"))
    EventGate(failed).pass_on(lambda: seen.append("second"))
    assert seen == ["first", "second"]
    failed.exception()  # retrieved: no "never retrieved" warning
