"""Submits run at once in the shared pool; collectors wait asynchronously, in slot order."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import numpy as np

from comfyfleet import imaging
from comfyfleet.engine.events import ProgressText
from comfyfleet.engine.run import ExecutionResult
from comfyfleet.fanout import FanoutSettings, PoolSize
from comfyfleet.fanout.pool import WAIT_REPORT_INTERVAL
from comfyfleet.testing.emulators.png import colour
from tests.emulators import Emulator
from tests.helpers import Recorder
from tests.integration.fanout.conftest import Graph, MakeRig, Rig


async def run(rig: Rig, prompt: dict[str, Any], sink: Any = None) -> ExecutionResult:
    checked, result = await rig.engine.run_prompt(prompt, sink=sink or Recorder())
    assert checked.ok, checked.node_errors
    assert result is not None
    return result


def status_of(result: ExecutionResult, collector: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(result.outputs[collector]["text"][0])
    return report


def pixel(image: Any) -> tuple[int, int, int]:
    r, g, b = (np.asarray(image)[0, 0, 0, :3] * 255).round().astype(int)
    return int(r), int(g), int(b)


async def test_thirty_two_second_jobs_finish_in_about_two_seconds(
    rig: Rig, emulator: Emulator
) -> None:
    emulator.settings.latency, emulator.settings.jitter = 2.0, 0.4  # finish out of order
    graph = Graph(emulator.url)
    tasks = [graph.submit(f"s{n}", f"variant {n}", seed=n) for n in range(1, 31)]
    graph.collect("c", tasks)
    for n in (1, 7, 30):
        graph.save(f"save{n}", "c", n - 1, prefix=f"slot{n}")
    started = time.monotonic()
    result = await run(rig, graph.prompt)
    elapsed = time.monotonic() - started
    assert result.status == "success", result.error
    assert 2.0 <= elapsed < 4.5, elapsed  # one wave, not thirty of them (60 s)
    assert emulator.stats()["jobs"] == 30 and emulator.stats()["duplicates"] == 0
    assert sending_spread(emulator) < 1.0  # every job was sent before the first one ended
    # task_n is always image_n, whatever finished first: the emulator colours by prompt.
    for n in (1, 7, 30):
        saved = result.outputs[f"save{n}"]["images"][0]["filename"]
        image = imaging.decode((rig.engine.folders.output / saved).read_bytes())[0]
        assert pixel(image) == colour(f"variant {n}", n), n
    report = status_of(result, "c")
    assert report["counts"] == {"success": 30}
    assert [(s["slot"], s["node"]) for s in report["slots"]] == [(n, f"s{n}") for n in range(1, 31)]
    assert all(s["remote_id"] and s["running_seconds"] >= 1.5 for s in report["slots"])


def sending_spread(emulator: Emulator) -> float:
    """Seconds between the first and the last job-creating request the emulator saw."""
    times = [when for when, _path, _status in emulator.state.create_log]
    return max(times) - min(times)


async def test_two_collectors_in_one_graph_overlap(rig: Rig, emulator: Emulator) -> None:
    emulator.settings.latency = 1.0
    graph = Graph(emulator.url)
    graph.collect("a", [graph.submit(f"a{n}", "first batch", seed=n) for n in range(10)])
    graph.collect("b", [graph.submit(f"b{n}", "second batch", seed=n) for n in range(10)])
    started = time.monotonic()
    result = await run(rig, graph.prompt)
    elapsed = time.monotonic() - started
    assert result.status == "success", result.error
    assert sending_spread(emulator) < 0.8  # both batches were out before either came back
    assert elapsed < 3.0, elapsed  # about one job's time, with room for a busy machine
    counts = {"success": 10, "not_connected": 20}
    assert status_of(result, "a")["counts"] == status_of(result, "b")["counts"] == counts
    assert emulator.stats()["jobs"] == 20


async def test_a_full_pool_waits_without_blocking_other_prompts(
    rig: Rig, emulator: Emulator
) -> None:
    emulator.settings.latency = 1.0
    graph = Graph(emulator.url)
    tasks = [graph.submit(f"s{n:02}", "crowd", seed=n) for n in range(61)]  # 30 + 30 + 1
    for c, start in enumerate(range(0, 61, 30)):
        graph.collect(f"c{c}", tasks[start : start + 30])
    other = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        },
        "2": {"class_type": "PreviewAny", "inputs": {"source": "done"}},
    }
    events = Recorder()
    started = time.monotonic()
    crowd = asyncio.create_task(run(rig, graph.prompt, events))
    await asyncio.sleep(0.5)  # the crowd fills the pool; one submit waits for room
    waiting = [e for e in events.events if isinstance(e, ProgressText)]
    assert [e.text for e in waiting] == ["waiting for a slot, 30 ahead"]
    quick_start = time.monotonic()
    quick = await run(rig, other)
    assert quick.status == "success" and time.monotonic() - quick_start < 1.5
    assert not crowd.done()
    result = await crowd
    assert result.status == "success", result.error
    assert 2.0 <= time.monotonic() - started < 3.8  # two waves of one second
    assert emulator.stats()["jobs"] == 61
    assert rig.service.pools["image"].running == rig.service.pools["image"].waiting == 0


async def test_waiting_text_is_sent_when_it_changes_at_a_bounded_rate(
    make_rig: MakeRig, emulator: Emulator
) -> None:
    emulator.settings.latency = 0.05
    rig = await make_rig(FanoutSettings(image=PoolSize(2, 0)))
    jobs = 60
    graph = Graph(emulator.url)
    tasks = [graph.submit(f"s{n:02}", "queue", seed=n) for n in range(jobs)]
    for c, start in enumerate(range(0, jobs, 30)):
        graph.collect(f"c{c}", tasks[start : start + 30], mode="placeholder")
    heard: dict[str, list[tuple[float, int]]] = {}

    def sink(event: Any) -> None:
        if isinstance(event, ProgressText) and event.text.startswith("waiting for a slot"):
            ahead = int(event.text.split(", ")[1].split()[0])
            heard.setdefault(event.node_id, []).append((time.monotonic(), ahead))

    started = time.monotonic()
    result = await run(rig, graph.prompt, sink)
    elapsed = time.monotonic() - started
    assert result.status == "success", result.error
    assert len(heard) >= jobs - 4  # nearly every submit waited, and said so
    for frames in heard.values():
        numbers = [ahead for _, ahead in frames]
        assert numbers == sorted(set(numbers), reverse=True)  # only when it changes
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise(frames)]
        assert all(gap >= WAIT_REPORT_INTERVAL * 0.9 for gap in gaps), gaps
    # Each waiter hears at most one update per interval: linear in the jobs (one frame
    # per change for every waiter would be about jobs**2 / 2 = 1,800 here).
    sent = sum(len(f) for f in heard.values())
    assert sent <= jobs * (1 + elapsed / WAIT_REPORT_INTERVAL), (sent, elapsed)


async def test_the_status_says_which_slots_share_one_job(rig: Rig, emulator: Emulator) -> None:
    emulator.settings.latency = 0.1
    graph = Graph(emulator.url)
    same = [graph.submit(f"same{n}", "one picture", seed=7) for n in range(4)]
    other = graph.submit("other", "another picture", seed=8)
    graph.collect("c", [*same, other])
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    slots = status_of(result, "c")["slots"]
    assert emulator.stats()["jobs"] == 2  # four identical submits, one job
    assert [s["shared_by_slots"] for s in slots[:4]] == [[1, 2, 3, 4]] * 4
    assert slots[4]["shared_by_slots"] is None
    assert "shared_by_slots" not in slots[5]  # not connected
