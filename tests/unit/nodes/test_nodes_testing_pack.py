"""The testing pack: sleeping, failing and progress-reporting nodes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from comfyfleet.engine.context import InterruptProcessingException
from comfyfleet.nodes import build_registry, testing
from tests.unit.nodes.conftest import AsNode


def test_registered_only_on_request() -> None:
    registry = build_registry(testing=True)
    assert not registry.failures
    async_nodes = {
        n
        for n in ("Sleep", "Fail", "Progress", "TestSleep", "TestSyncError")
        if registry.nodes[n].is_async
    }
    assert async_nodes == {"Sleep", "TestSleep"}
    assert "Sleep" not in build_registry()


def test_comfyui_twins_have_comfyui_interfaces() -> None:
    registry = build_registry(testing=True)
    sleep = json.loads(json.dumps(registry.nodes["TestSleep"].object_info()))
    assert sleep["input"] == {
        "required": {
            "value": ["*", {}],
            "seconds": [
                "FLOAT",
                {
                    "default": 1.0,
                    "min": 0.0,
                    "max": 9999.0,
                    "step": 0.01,
                    "tooltip": "The amount of seconds to sleep.",
                },
            ],
        },
        "hidden": {"unique_id": "UNIQUE_ID"},
    }
    assert (sleep["output"], sleep["category"], sleep["display_name"]) == (
        ["*"],
        "_for_testing",
        "Test Sleep",
    )
    error = registry.nodes["TestSyncError"]
    assert json.loads(json.dumps(error.object_info()["input"])) == {
        "required": {"value": ["*", {}]}
    }
    assert (error.function_name, error.category, error.display_name) == (
        "sync_error",
        "_for_testing/async",
        "Test Sync Error",
    )
    assert error.return_types == ("*",)


@pytest.mark.parametrize("node", [testing.Sleep, testing.TestSleep])
async def test_sleep_reports_progress_and_returns_value(as_node: AsNode, node: type) -> None:
    with as_node("7") as control:
        start = time.monotonic()
        assert await node().sleep(value="v", seconds=0.1, unique_id="3") == ("v",)
        elapsed = time.monotonic() - start
    assert elapsed >= 0.1
    assert len(control.progress) >= 3
    assert {entry[0] for entry in control.progress} == {"3"}
    values = [value for _, value, _ in control.progress]
    assert values == sorted(values) and values[-1] == pytest.approx(0.1)
    assert {total for _, _, total in control.progress} == {0.1}


async def test_sleep_stops_when_interrupted(as_node: AsNode) -> None:
    with as_node("3", interrupt_after=5) as control:
        start = time.monotonic()
        with pytest.raises(InterruptProcessingException):
            await testing.Sleep().sleep(value=1, seconds=30.0, unique_id="3")
    assert time.monotonic() - start < 2.0
    assert len(control.progress) == 5


@pytest.mark.parametrize("node", [testing.Sleep, testing.TestSleep])
async def test_a_cancelled_sleep_stops_at_once(as_node: AsNode, node: type) -> None:
    # The engine interrupts an async node by cancelling its task: the sleep, which wakes
    # only to report, must not outlast the cancel.
    with as_node("3") as control:
        task = asyncio.create_task(node().sleep(value=1, seconds=30.0, unique_id="3"))
        await asyncio.sleep(0.12)
        cancelled = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert time.monotonic() - cancelled < 0.05
    assert control.progress and control.progress[-1][1] < 1.0


@pytest.mark.parametrize(
    ("node", "fewest", "most"), [(testing.Sleep, 8, 12), (testing.TestSleep, 30, 52)]
)
async def test_sleep_reports_at_its_own_pace(
    as_node: AsNode, monkeypatch: pytest.MonkeyPatch, node: type, fewest: int, most: int
) -> None:
    # Sleep reports 20 times a second (as a sampler would), TestSleep every 10 ms (as
    # ComfyUI's does); each wakes only to report (16 idle backends sleeping add no load).
    naps: list[float] = []
    real_sleep = asyncio.sleep

    async def counted(delay: float) -> None:
        naps.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(asyncio, "sleep", counted)
    with as_node("3") as control:
        await node().sleep(value=1, seconds=0.5, unique_id="3")
    assert fewest <= len(control.progress) <= most
    assert len(naps) == len(control.progress) - 1  # one nap between two reports


async def test_sleep_for_zero_seconds_returns_at_once(as_node: AsNode) -> None:
    with as_node("3") as control:
        assert await testing.Sleep().sleep(value=None, seconds=0.0, unique_id="3") == (None,)
    assert control.progress == []


def test_fail_raises_its_message() -> None:
    with pytest.raises(RuntimeError, match=r"^boom$"):
        testing.Fail().fail(message="boom")
    with pytest.raises(RuntimeError) as caught:
        testing.TestSyncError().sync_error(value=1)
    assert str(caught.value) == "Intentional sync execution error for testing"


def test_progress_reports_every_step(as_node: AsNode) -> None:
    with as_node("8") as control:
        assert testing.Progress().run(value=[1], steps=4, seconds_per_step=0.0) == ([1],)
    assert control.progress == [("8", 1, 4), ("8", 2, 4), ("8", 3, 4), ("8", 4, 4)]


def test_progress_stops_when_interrupted(as_node: AsNode) -> None:
    with as_node("8", interrupt_after=2) as control, pytest.raises(InterruptProcessingException):
        testing.Progress().run(value=0, steps=100, seconds_per_step=0.001)
    assert len(control.progress) == 2
