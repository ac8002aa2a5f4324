"""Execution: order, concurrency, failures, interrupts, list mapping, lazy inputs."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from comfyfleet.engine.blocker import ExecutionBlocker
from comfyfleet.engine.context import ProgressBar
from comfyfleet.engine.executor import Engine
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.run import RunHandle
from tests.helpers import Recorder

CALLS: list[tuple[str, Any]] = []


class Const:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("INT", {"default": 0, "min": -1000, "max": 1000})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value: int) -> tuple[int]:
        CALLS.append(("Const", value))
        return (value,)


class Many:
    """Emits a list: downstream nodes are called once per item."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"count": ("INT", {"default": 3, "min": 0, "max": 100})}}

    RETURN_TYPES = ("INT",)
    OUTPUT_IS_LIST = (True,)
    FUNCTION = "run"

    def run(self, count: int) -> tuple[list[int]]:
        return (list(range(count)),)


class AddOne:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("INT", {})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value: int) -> tuple[int]:
        CALLS.append(("AddOne", value))
        return (value + 1,)


class Collect:
    """An output node; with INPUT_IS_LIST it sees the whole list in one call."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"values": ("*", {})}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    INPUT_IS_LIST = True
    FUNCTION = "run"

    def run(self, values: list[Any]) -> dict[str, Any]:
        return {"ui": {"values": [repr(values)]}}


class Show:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("*", {})}, "optional": {"other": ("*", {})}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "run"

    def run(self, value: Any, other: Any = None) -> dict[str, Any]:
        return {"ui": {"value": [repr(value)], "thread": [threading.current_thread().name]}}


class Switch:
    """Lazy inputs: only the chosen branch is evaluated."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "choose_a": ("BOOLEAN", {"default": True}),
                "a": ("*", {"lazy": True}),
                "b": ("*", {"lazy": True}),
            }
        }

    RETURN_TYPES = ("*",)
    FUNCTION = "run"

    def check_lazy_status(self, choose_a: bool, a: Any = None, b: Any = None) -> list[str]:
        return ["a"] if choose_a else ["b"]

    def run(self, choose_a: bool, a: Any = None, b: Any = None) -> tuple[Any]:
        return (a if choose_a else b,)


class Gate:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("*", {}), "message": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("*",)
    FUNCTION = "run"

    def run(self, value: Any, message: str) -> tuple[Any]:
        return (ExecutionBlocker(message or None),)


class PackBlocker:
    """A node pack's own blocker class, as ComfyUI's `comfy_execution.graph` has."""

    def __init__(self, message: str | None) -> None:
        self.message = message


PackBlocker.__name__ = PackBlocker.__qualname__ = "ExecutionBlocker"


class PackGate:
    """Blocks the items where `block` is true with the pack's own blocker (list-mapped)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("*", {}), "block": ("BOOLEAN", {"default": False})}}

    RETURN_TYPES = ("*",)
    FUNCTION = "run"

    def run(self, value: Any, block: bool) -> tuple[Any]:
        return (PackBlocker(None) if block else value,)


class Bools:
    """A list of booleans, one per character of `pattern` ("1" is true)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"pattern": ("STRING", {"default": "010"})}}

    RETURN_TYPES = ("BOOLEAN",)
    OUTPUT_IS_LIST = (True,)
    FUNCTION = "run"

    def run(self, pattern: str) -> tuple[list[bool]]:
        return ([c == "1" for c in pattern],)


class Cancellable:
    """Async; records whether it was cancelled."""

    cancelled: list[str] = []

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("*", {}), "seconds": ("FLOAT", {"default": 5.0})}}

    RETURN_TYPES = ("*",)
    FUNCTION = "run"

    async def run(self, value: Any, seconds: float) -> tuple[Any]:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            Cancellable.cancelled.append("yes")
            raise
        return (value,)


class BlockingSleep:
    """A plain function that blocks its thread; the loop must keep running."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("*", {}), "seconds": ("FLOAT", {"default": 0.5})}}

    RETURN_TYPES = ("*",)
    FUNCTION = "run"

    def run(self, value: Any, seconds: float) -> tuple[Any]:
        time.sleep(seconds)
        return (value,)


class Hidden:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"value": ("INT", {})},
            "hidden": {
                "prompt": "PROMPT",
                "unique_id": "UNIQUE_ID",
                "extra_pnginfo": "EXTRA_PNGINFO",
                "dynprompt": "DYNPROMPT",
            },
        }

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "run"

    def run(
        self, value: int, prompt: Any, unique_id: str, extra_pnginfo: Any, dynprompt: Any
    ) -> dict[str, Any]:
        return {
            "ui": {
                "seen": [
                    sorted(prompt),
                    unique_id,
                    extra_pnginfo,
                    dynprompt.get_node(unique_id)["class_type"],
                ]
            }
        }


class BadReturn:
    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("INT", {})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value: int) -> int:
        return value


class Counter:
    """Reports `steps` progress updates from a worker thread."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"value": ("*", {}), "steps": ("INT", {"default": 3})}}

    RETURN_TYPES = ("*",)
    FUNCTION = "run"

    def run(self, value: Any, steps: int) -> tuple[Any]:
        bar = ProgressBar(steps)
        for _ in range(steps):
            bar.update(1)
        return (value,)


NODE_CLASSES: tuple[type, ...] = (Const, Many, AddOne, Collect, Show, Switch, Gate, Cancellable)
NODE_CLASSES += (BlockingSleep, Hidden, BadReturn, Counter, PackGate, Bools)
TEST_NODES = {cls.__name__: cls for cls in NODE_CLASSES}


@pytest.fixture
def registry(registry: NodeRegistry) -> NodeRegistry:
    registry.add_pack(TEST_NODES, pack="tests", python_module="tests")
    CALLS.clear()
    Cancellable.cancelled.clear()
    return registry


def sleep_prompt(seconds: float, color: int = 0, sleepers: int = 1) -> dict[str, Any]:
    prompt: dict[str, Any] = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color},
        },
    }
    last = "1"
    for i in range(sleepers):
        node = str(10 + i)
        prompt[node] = {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}}
        last = node
    prompt["9"] = {"class_type": "Collect", "inputs": {"values": [last, 0]}}
    for i in range(sleepers - 1):
        prompt[f"8{i}"] = {"class_type": "Show", "inputs": {"value": [str(10 + i), 0]}}
    return prompt


async def test_three_async_sleeps_in_one_prompt_overlap(engine: Engine) -> None:
    started = time.monotonic()
    checked, result = await engine.run_prompt(sleep_prompt(1.0, sleepers=3))
    elapsed = time.monotonic() - started
    assert checked.ok and result is not None
    assert result.status == "success"
    assert set(result.outputs) == {"9", "80", "81"}
    assert 0.95 <= elapsed < 1.8, elapsed


async def test_twenty_prompts_run_concurrently_and_one_is_interrupted(engine: Engine) -> None:
    handles = [RunHandle() for _ in range(20)]
    sinks = [Recorder() for _ in range(20)]
    started = time.monotonic()
    runs = [
        asyncio.create_task(
            engine.run_prompt(
                sleep_prompt(1.0, color=i), prompt_id=f"p{i}", sink=sinks[i], handle=handles[i]
            )
        )
        for i in range(20)
    ]
    await asyncio.sleep(0.3)
    handles[7].interrupt()
    results = [r for _, r in await asyncio.gather(*runs)]
    elapsed = time.monotonic() - started
    assert elapsed < 2.5, elapsed
    statuses = [r.status if r else None for r in results]
    assert statuses[7] == "interrupted"
    assert statuses[:7] + statuses[8:] == ["success"] * 19
    assert results[7] is not None and results[7].outputs == {}
    assert sinks[7].types()[-2:] == ["execution_interrupted", "executing"]
    for i, sink in enumerate(sinks):
        ids = {m.data.get("prompt_id") for m in sink.messages()}
        assert ids == {f"p{i}"}, "events reached another prompt's sink"
        if i != 7:
            assert "execution_success" in sink.types()


async def test_identical_prompt_is_fully_cached(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "Const", "inputs": {"value": 5}},
        "2": {"class_type": "AddOne", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    first, second = Recorder(), Recorder()
    _, r1 = await engine.run_prompt(prompt, sink=first)
    _, r2 = await engine.run_prompt(prompt, sink=second)
    assert r1 is not None and r2 is not None
    assert CALLS == [("Const", 5), ("AddOne", 5)]
    cached = second.messages("execution_cached")[0].data["nodes"]
    assert cached == ["1", "2", "3"]
    assert [m.data["node"] for m in second.messages("executing")] == [None]
    assert second.messages("executed")[0].data["output"] == r1.outputs["3"]
    assert r2.outputs == r1.outputs
    assert second.types() == [
        "execution_start",
        "execution_cached",
        "executed",
        "progress_state",
        "execution_success",
        "executing",
    ]


async def test_changed_constant_reruns_only_downstream(engine: Engine) -> None:
    base: dict[str, dict[str, Any]] = {
        "1": {"class_type": "Const", "inputs": {"value": 5}},
        "2": {"class_type": "AddOne", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0], "other": ["4", 0]}},
        "4": {"class_type": "Const", "inputs": {"value": 9}},
    }
    await engine.run_prompt(base)
    CALLS.clear()
    base["4"]["inputs"]["value"] = 10
    sink = Recorder()
    await engine.run_prompt(base, sink=sink)
    assert CALLS == [("Const", 10)]
    assert sorted(sink.messages("execution_cached")[0].data["nodes"]) == ["1", "2"]


async def test_cache_is_bounded(registry: NodeRegistry, tmp_path: Any) -> None:
    from comfyfleet.folders import Folders

    engine = Engine(registry, Folders.under(tmp_path), cache_entries=2)
    try:
        for value in range(5):
            await engine.run_prompt(
                {
                    "1": {"class_type": "Const", "inputs": {"value": value}},
                    "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
                }
            )
        assert len(engine.cache) == 2
    finally:
        engine.close()


async def test_first_failure_stops_the_prompt_and_cancels_async_work(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "Const", "inputs": {"value": 1}},
        "2": {"class_type": "Cancellable", "inputs": {"value": ["1", 0], "seconds": 5.0}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
        "4": {"class_type": "Fail", "inputs": {"value": ["1", 0], "message": "broken on purpose"}},
        "5": {"class_type": "Show", "inputs": {"value": ["4", 0]}},
    }
    sink = Recorder()
    started = time.monotonic()
    _, result = await engine.run_prompt(prompt, sink=sink)
    assert time.monotonic() - started < 2.0
    assert result is not None and result.status == "error"
    assert Cancellable.cancelled == ["yes"]
    error = sink.messages("execution_error")[0].data
    assert error["node_id"] == "4" and error["node_type"] == "Fail"
    assert error["exception_message"] == "broken on purpose\n"
    assert error["exception_type"] == "RuntimeError"
    assert error["current_inputs"]["message"] == ["broken on purpose"]
    assert isinstance(error["traceback"], list) and error["traceback"]
    assert "execution_success" not in sink.types()
    assert sink.types()[-1] == "executing"
    assert result.status_record()["status_str"] == "error"


async def test_sync_nodes_run_in_worker_threads_without_blocking_the_loop(engine: Engine) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    prompt = {
        "1": {"class_type": "Const", "inputs": {"value": 1}},
        "2": {"class_type": "BlockingSleep", "inputs": {"value": ["1", 0], "seconds": 0.5}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    _, result = await engine.run_prompt(prompt)
    tick_task.cancel()
    assert result is not None and result.status == "success"
    assert ticks >= 20, f"event loop starved: {ticks} ticks in 0.5 s"
    assert result.outputs["3"]["thread"][0].startswith("comfyfleet-node")


async def test_list_outputs_map_downstream_calls(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "Many", "inputs": {"count": 3}},
        "2": {"class_type": "AddOne", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "Collect", "inputs": {"values": ["2", 0]}},
    }
    _, result = await engine.run_prompt(prompt)
    assert result is not None
    assert CALLS == [("AddOne", 0), ("AddOne", 1), ("AddOne", 2)]
    assert result.outputs["3"] == {"values": ["[1, 2, 3]"]}


async def test_lazy_inputs_evaluate_only_the_chosen_branch(engine: Engine) -> None:
    def prompt(choose_a: bool) -> dict[str, Any]:
        return {
            "1": {"class_type": "Const", "inputs": {"value": 1}},
            "2": {"class_type": "Const", "inputs": {"value": 2}},
            "3": {
                "class_type": "Switch",
                "inputs": {"choose_a": choose_a, "a": ["1", 0], "b": ["2", 0]},
            },
            "4": {"class_type": "Show", "inputs": {"value": ["3", 0]}},
        }

    _, result = await engine.run_prompt(prompt(False))
    assert result is not None and result.outputs["4"]["value"] == ["2"]
    assert CALLS == [("Const", 2)]


async def test_execution_blocker_skips_downstream_without_failing(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "Const", "inputs": {"value": 1}},
        "2": {"class_type": "Gate", "inputs": {"value": ["1", 0], "message": "stopped here"}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
        "4": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
    }
    sink = Recorder()
    _, result = await engine.run_prompt(prompt, sink=sink)
    assert result is not None and result.status == "success"
    assert set(result.outputs) == {"4"}
    blocked = sink.messages("execution_error")
    assert [m.data["exception_message"] for m in blocked] == ["Execution Blocked: stopped here"]


async def test_hidden_inputs_reach_the_node(engine: Engine) -> None:
    prompt = {"7": {"class_type": "Hidden", "inputs": {"value": 1}}}
    _, result = await engine.run_prompt(
        prompt, extra_data={"extra_pnginfo": {"workflow": {"a": 1}}}
    )
    assert result is not None
    assert result.outputs["7"]["seen"] == [["7"], "7", {"workflow": {"a": 1}}, "Hidden"]


async def test_wrong_return_shape_is_a_clear_node_error(engine: Engine) -> None:
    prompt = {
        "1": {"class_type": "BadReturn", "inputs": {"value": 1}},
        "2": {"class_type": "Show", "inputs": {"value": ["1", 0]}},
    }
    _, result = await engine.run_prompt(prompt)
    assert result is not None and result.error is not None
    assert result.error["node_id"] == "1"
    assert "expected a tuple of 1 output" in result.error["exception_message"]


async def test_progress_from_threads_reaches_only_its_own_prompt(engine: Engine) -> None:
    def prompt(steps: int) -> dict[str, Any]:
        return {
            "1": {"class_type": "Const", "inputs": {"value": steps}},
            "2": {"class_type": "Counter", "inputs": {"value": ["1", 0], "steps": steps}},
            "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
        }

    sinks = [Recorder(), Recorder()]
    await asyncio.gather(
        engine.run_prompt(prompt(3), prompt_id="a", sink=sinks[0]),
        engine.run_prompt(prompt(5), prompt_id="b", sink=sinks[1]),
    )
    for sink, steps, pid in ((sinks[0], 3, "a"), (sinks[1], 5, "b")):
        progress = sink.messages("progress")
        assert [m.data["value"] for m in progress] == list(range(1, steps + 1))
        assert {m.data["prompt_id"] for m in progress} == {pid}
        assert {m.data["node"] for m in progress} == {"2"}


async def test_only_the_outputs_that_validated_run(engine: Engine) -> None:
    # Output 5 links to a node that is not in the prompt: it fails validation, output 4 runs.
    prompt = {
        "1": {"class_type": "Const", "inputs": {"value": 1}},
        "2": {"class_type": "AddOne", "inputs": {"value": ["1", 0]}},
        "3": {"class_type": "AddOne", "inputs": {"value": ["removeme", 0]}},
        "4": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
        "5": {"class_type": "Show", "inputs": {"value": ["3", 0]}},
    }
    sink = Recorder()
    checked, result = await engine.run_prompt(prompt, sink=sink)
    assert checked.ok and checked.outputs == ["4"]
    assert checked.node_errors["3"]["dependent_outputs"] == ["5"]
    assert result is not None
    assert result.status == "success", result.error
    assert result.outputs == {"4": {"value": ["2"], "thread": result.outputs["4"]["thread"]}}
    assert CALLS == [("Const", 1), ("AddOne", 1)]
    assert "execution_success" in sink.types()


async def test_a_node_packs_own_execution_blocker_blocks_like_the_engines(engine: Engine) -> None:
    # The middle item of three is blocked: downstream calls run for the other two only.
    prompt = {
        "1": {"class_type": "Many", "inputs": {"count": 3}},
        "2": {"class_type": "Bools", "inputs": {"pattern": "010"}},
        "3": {"class_type": "PackGate", "inputs": {"value": ["1", 0], "block": ["2", 0]}},
        "4": {"class_type": "AddOne", "inputs": {"value": ["3", 0]}},
        "5": {"class_type": "Show", "inputs": {"value": ["4", 0]}},
        "6": {"class_type": "Collect", "inputs": {"values": ["4", 0]}},
    }
    _, result = await engine.run_prompt(prompt)
    assert result is not None
    assert result.status == "success", result.error
    assert CALLS == [("AddOne", 0), ("AddOne", 2)]
    assert result.outputs["5"]["value"] == ["1", "3"]
    # A list input holding a blocker blocks the whole call, as in ComfyUI.
    assert "6" not in result.outputs


async def wait_quiet(handle: RunHandle) -> None:
    for _ in range(200):
        if handle.quiet:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the run never went quiet")


def executing(sink: Recorder) -> list[str | None]:
    return [m.data["node"] for m in sink.messages("executing")]


async def test_a_paused_prompt_stops_its_node_and_runs_it_again_when_resumed(
    engine: Engine,
) -> None:
    """Held back (the gateway cannot prove its lease), a node that looks whether to stop
    stops; nothing else starts; resumed, the node runs again from its start."""
    handle, sink = RunHandle(), Recorder()
    prompt = sleep_prompt(0.6)
    run = asyncio.create_task(engine.run_prompt(prompt, prompt_id="p", sink=sink, handle=handle))
    await asyncio.sleep(0.3)
    assert not handle.quiet
    handle.pause()
    await wait_quiet(handle)
    await asyncio.sleep(0.6)  # longer than the sleep had left: it did not run on
    assert not run.done() and executing(sink) == ["1", "10"]
    handle.resume()
    _, result = await run
    assert result is not None and result.status == "success", result
    assert executing(sink) == ["1", "10", "10", "9", None]
    assert "execution_interrupted" not in sink.types()


async def test_a_stopped_async_node_is_cancelled_and_runs_again(engine: Engine) -> None:
    """A node that never looks (an async call waiting on something) is cancelled by
    `stop` while paused, and runs again when resumed."""
    prompt = {
        "1": {"class_type": "Const", "inputs": {"value": 4}},
        "2": {"class_type": "Cancellable", "inputs": {"value": ["1", 0], "seconds": 0.3}},
        "3": {"class_type": "Show", "inputs": {"value": ["2", 0]}},
    }
    handle, sink = RunHandle(), Recorder()
    run = asyncio.create_task(engine.run_prompt(prompt, prompt_id="p", sink=sink, handle=handle))
    await asyncio.sleep(0.1)
    handle.pause()
    await asyncio.sleep(0.05)
    assert not handle.quiet  # the call runs on until stopped
    handle.stop()
    await wait_quiet(handle)
    assert Cancellable.cancelled == ["yes"]
    handle.resume()
    _, result = await run
    assert result is not None and result.status == "success", result
    assert result.outputs["3"]["value"] == ["4"]
    assert executing(sink).count("2") == 2


async def test_a_paused_prompt_interrupted_ends_interrupted(engine: Engine) -> None:
    handle, sink = RunHandle(), Recorder()
    run = asyncio.create_task(
        engine.run_prompt(sleep_prompt(0.6), prompt_id="p", sink=sink, handle=handle)
    )
    await asyncio.sleep(0.2)
    handle.pause()
    await wait_quiet(handle)
    handle.interrupt()
    _, result = await asyncio.wait_for(run, 5)
    assert result is not None and result.status == "interrupted"
    assert sink.types()[-2:] == ["execution_interrupted", "executing"]


async def test_a_prompt_that_may_not_proceed_starts_no_node(engine: Engine) -> None:
    """`may_proceed` is read by the clock, before any callback could pause the run."""
    allowed = False
    handle, sink = RunHandle(), Recorder()
    handle.may_proceed = lambda: allowed
    run = asyncio.create_task(
        engine.run_prompt(sleep_prompt(0.1), prompt_id="p", sink=sink, handle=handle)
    )
    await asyncio.sleep(0.4)
    assert executing(sink) == [] and not run.done()
    allowed = True
    _, result = await asyncio.wait_for(run, 5)
    assert result is not None and result.status == "success"
