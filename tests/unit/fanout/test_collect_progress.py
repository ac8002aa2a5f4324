"""A collector's progress reports: a batch's results arriving together make one report,
the last count always goes out, and a count held back is shown on time (fanout/collect.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from comfyfleet.engine.context import NodeContext, Preview
from comfyfleet.fanout import FanoutService, collect
from comfyfleet.fanout.collect import PROGRESS_EVERY, Collected
from comfyfleet.fanout.journal import MemoryJournal
from comfyfleet.fanout.task import Task, TaskInfo, TaskState


class Reports:
    """A prompt's control that notes each progress report and when it came."""

    interrupted = False
    stopping = False

    def __init__(self) -> None:
        self.seen: list[tuple[float, float, float]] = []

    def report_progress(
        self, node_id: str, value: float, total: float, preview: Preview | None
    ) -> None:
        self.seen.append((asyncio.get_running_loop().time(), value, total))

    def send_text(self, node_id: str, text: str) -> None:
        pass

    def counts(self) -> list[tuple[float, float]]:
        return [(value, total) for _, value, total in self.seen]


@pytest.fixture
async def service() -> AsyncIterator[FanoutService]:
    made = FanoutService(MemoryJournal(), resume=False)
    yield made
    await made.close()


def tasks(n: int) -> list[Task | None]:
    return [Task("image", TaskInfo("bfl", str(slot), "p1")) for slot in range(n)]


def gather(
    service: FanoutService, slots: list[Task | None], reports: Reports
) -> asyncio.Future[Collected]:
    node = NodeContext("p1", "9", "9", None, reports)
    return asyncio.ensure_future(collect(service, slots, "placeholder", node, lambda: None))


async def test_a_batch_that_ends_together_is_reported_once(service: FanoutService) -> None:
    reports, slots = Reports(), tasks(30)
    waiting = gather(service, slots, reports)
    await asyncio.sleep(0.01)
    for n, task in enumerate(slots):
        assert task is not None
        task.settle(TaskState.SUCCESS, n)
        await asyncio.sleep(0)  # one result at a time, as downloads end
    collected = await waiting
    assert collected.values == list(range(30))
    assert json.loads(collected.status)["counts"]["success"] == 30
    assert reports.counts()[0] == (0, 30) and reports.counts()[-1] == (30, 30)
    assert len(reports.seen) <= 3, reports.counts()  # one per result before: 31


async def test_a_count_held_back_is_shown_when_its_time_comes(service: FanoutService) -> None:
    reports, slots = Reports(), tasks(2)
    first, second = slots
    assert first is not None and second is not None
    waiting = gather(service, slots, reports)
    await asyncio.sleep(0)
    first.settle(TaskState.SUCCESS, "a")  # right after the first report: held back
    await asyncio.sleep(PROGRESS_EVERY * 3)
    assert reports.counts() == [(0, 2), (1, 2)]
    started, _, _ = reports.seen[0]
    shown, _, _ = reports.seen[1]
    assert PROGRESS_EVERY * 0.9 <= shown - started <= PROGRESS_EVERY * 2.5
    second.settle(TaskState.SUCCESS, "b")
    await waiting
    assert reports.counts() == [(0, 2), (1, 2), (2, 2)]
