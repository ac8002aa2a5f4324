"""Fan-out nodes: a "Concurrent Submit" twin of every image/video node, and the collectors.

A twin is minted at start-up for every registered node whose first output is
IMAGE or VIDEO (built-in and custom packs alike; a class opts out with
`CONCURRENT_SUBMIT = False`). It has the original's inputs (a deep copy of its
INPUT_TYPES) and validation (its VALIDATE_INPUTS wrapped with the exact same
signature, so the built-in range and combo checks stay on for the same inputs),
and outputs a task at once: IMAGE_FUTURE or VIDEO_FUTURE, named `task`. The
original class is untouched, so serial and concurrent nodes mix in one graph.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import inspect
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

from comfyfleet import imaging
from comfyfleet.engine.context import current_node, set_current_node
from comfyfleet.engine.nodedef import NodeDef
from comfyfleet.engine.registry import NodeRegistry, PackFailure
from comfyfleet.fanout.collect import FAIL_FAST, FAILURE_MODES, collect
from comfyfleet.fanout.service import IMAGE, VIDEO
from comfyfleet.fanout.task import Task
from comfyfleet.fanout.video import placeholder_clip
from comfyfleet.nodes.providers.common import build_request, failure_epoch, fanout

SUBMIT_PREFIX = "Concurrent Submit | "
#: Set to False on a node class to get no Concurrent Submit twin.
OPT_OUT_ATTRIBUTE = "CONCURRENT_SUBMIT"
#: The output type whose nodes get twins -> (the twin's output type, the pool).
FUTURES = {"IMAGE": ("IMAGE_FUTURE", IMAGE), "VIDEO": ("VIDEO_FUTURE", VIDEO)}
PLACEHOLDER_SIZE = 64
PLACEHOLDER_RED = 0xFF0000


# -- submit twins ------------------------------------------------------------------


def add_submit_twins(registry: NodeRegistry) -> None:
    """Mint the twins of every eligible node; runs once all packs are loaded."""
    for builtin in (True, False):
        twins: dict[str, type] = {}
        names: dict[str, str | None] = {}
        for name, node in list(registry.nodes.items()):
            twin_name = SUBMIT_PREFIX + name
            if (name in registry.builtin_names) != builtin or twin_name in registry:
                continue
            if not wants_twin(node):
                continue
            try:
                twins[twin_name] = mint_twin(node)
            except Exception as exc:  # one odd class must not stop the others
                registry.failures.append(PackFailure("fanout", "", f"twin of {name!r}: {exc}"))
                continue
            names[twin_name] = SUBMIT_PREFIX + (node.display_name or name)
        registry.add_pack(
            twins, names, pack="fanout", python_module="comfyfleet.nodes.fanout", builtin=builtin
        )


def wants_twin(node: NodeDef) -> bool:
    first = node.return_types[0] if node.return_types else None
    return (
        isinstance(first, str)
        and first in FUTURES
        and getattr(node.cls, OPT_OUT_ATTRIBUTE, True) is not False
        and not node.name.startswith(SUBMIT_PREFIX)
    )


def mint_twin(node: NodeDef) -> type:
    original: Any = node.cls
    future_type, kind = FUTURES[node.return_types[0]]
    attrs: dict[str, Any] = {
        "INPUT_TYPES": classmethod(lambda _cls: copy.deepcopy(original.INPUT_TYPES())),
        "RETURN_TYPES": (future_type,),
        "RETURN_NAMES": ("task",),
        "FUNCTION": "submit",
        "CATEGORY": f"concurrent/{node.category}",
        "DESCRIPTION": f"Starts {node.name} in the shared {kind} pool and outputs its task at "
        "once; wire the task into a Concurrent Collect node.",
        "ORIGINAL_NODE": node.name,
        OPT_OUT_ATTRIBUTE: False,
        "IS_CHANGED": classmethod(_is_changed(getattr(original, "IS_CHANGED", None))),
        "submit": _submit(node, kind),
    }
    if node.input_is_list:
        attrs["INPUT_IS_LIST"] = True
    if node.not_idempotent:
        attrs["NOT_IDEMPOTENT"] = True
    if node.validate_fn is not None:
        attrs["VALIDATE_INPUTS"] = staticmethod(_same_signature(node.validate_fn))
    if node.has_lazy_status:
        attrs["check_lazy_status"] = _lazy_status(original)
    class_name = "ConcurrentSubmit_" + re.sub(r"\W", "_", node.name)
    return type(class_name, (), attrs)


def _same_signature(validate: Callable[..., Any]) -> Callable[..., Any]:
    """A pass-through that reports the original's signature: the validator reads the
    argument names to decide which inputs the node checks itself."""

    def validate_inputs(*args: Any, **kwargs: Any) -> Any:
        return validate(*args, **kwargs)

    validate_inputs.__signature__ = inspect.signature(validate)  # type: ignore[attr-defined]
    return validate_inputs


def _is_changed(inner: Callable[..., Any] | None) -> Callable[..., Any]:
    """The original's IS_CHANGED plus the failure epoch, so a failed task is never replayed
    from the cache: re-queuing runs it again (and reuses what succeeded)."""

    def is_changed(_cls: type, **inputs: Any) -> Any:
        epoch = failure_epoch()
        if inner is None:
            return epoch
        value = inner(**inputs)
        if isinstance(value, float) and math.isnan(value):
            return value  # "always changed" stays so
        return [value, epoch]

    return is_changed


def _lazy_status(original: Any) -> Callable[..., Any]:
    check = original.check_lazy_status
    if inspect.iscoroutinefunction(check):

        async def check_async(_self: Any, **inputs: Any) -> Any:
            return await original().check_lazy_status(**inputs)

        return check_async

    def check_sync(_self: Any, **inputs: Any) -> Any:
        return original().check_lazy_status(**inputs)

    return check_sync


def _submit(node: NodeDef, kind: str) -> Callable[..., Awaitable[tuple[Task]]]:
    async def submit(_self: Any, **inputs: Any) -> tuple[Task]:
        here = current_node()
        jobs = fanout()
        builder = getattr(node.cls(), "remote_request", None)
        if builder is not None:
            request = await build_request(builder, inputs)
            return (await jobs.submit(request, here),)
        return (await jobs.submit_local(kind, _local_call(node, inputs), here),)

    return submit


def _local_call(node: NodeDef, inputs: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
    """The original's own function as a job. It runs after the submit node has finished,
    so it reports to no node; folders and services stay available."""
    context = contextvars.copy_context()
    context.run(set_current_node, None)

    async def call() -> Any:
        function = getattr(node.cls(), node.function_name)
        if node.is_async:
            result = await asyncio.create_task(function(**inputs), context=context.copy())
        else:
            loop = asyncio.get_running_loop()
            bound = functools.partial(context.copy().run, function, **inputs)
            result = await loop.run_in_executor(None, bound)
        return _first_output(node, result)

    return call


def _first_output(node: NodeDef, result: Any) -> Any:
    if isinstance(result, dict):
        result = result.get("result")
    if not isinstance(result, tuple | list) or not result:
        raise TypeError(f"{node.name} returned no outputs")
    return result[0]


# -- collectors ---------------------------------------------------------------------


def _collector_inputs(slots: int, future: str) -> dict[str, Any]:
    optional: dict[str, Any] = {f"task_{n}": (future, {}) for n in range(2, slots + 1)}
    return {
        "required": {
            "task_1": (future, {}),
            "failure_mode": (FAILURE_MODES, {"default": FAIL_FAST}),
        },
        "optional": optional,
    }


def red_placeholder() -> imaging.ImageArray:
    return imaging.blank(1, PLACEHOLDER_SIZE, PLACEHOLDER_SIZE, PLACEHOLDER_RED)


async def _collect(slots: int, placeholder: Callable[[], Any], inputs: dict[str, Any]) -> Any:
    tasks: list[Task | None] = []
    for n in range(1, slots + 1):
        task = inputs.get(f"task_{n}")
        if task is not None and not isinstance(task, Task):
            raise TypeError(f"task_{n} is a {type(task).__name__}, not a task")
        tasks.append(task)
    mode = inputs.get("failure_mode", FAIL_FAST)
    collected = await collect(fanout(), tasks, mode, current_node(), placeholder)
    return {"ui": {"text": [collected.status]}, "result": (*collected.values, collected.status)}


class _Collector:
    """A collector output node: `SLOTS` task inputs, one output per slot, then `status`."""

    SLOTS: int
    FUTURE: str
    OUTPUT: str
    RETURN_TYPES: tuple[str, ...]
    RETURN_NAMES: tuple[str, ...]
    OUTPUT_NODE = True
    FUNCTION = "collect"
    CATEGORY = "concurrent"
    CONCURRENT_SUBMIT = False  # waits for tasks: a task of it would make no sense

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.RETURN_TYPES = (*(cls.OUTPUT,) * cls.SLOTS, "STRING")
        name = cls.OUTPUT.lower()
        cls.RETURN_NAMES = (*(f"{name}_{n}" for n in range(1, cls.SLOTS + 1)), "status")

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return _collector_inputs(cls.SLOTS, cls.FUTURE)

    @staticmethod
    def placeholder() -> Any:
        raise NotImplementedError

    async def collect(self, **inputs: Any) -> Any:
        return await _collect(self.SLOTS, type(self).placeholder, inputs)


class ConcurrentCollectImages(_Collector):
    SLOTS, FUTURE, OUTPUT = 30, "IMAGE_FUTURE", "IMAGE"
    DESCRIPTION = (
        "Waits for image tasks and outputs them by slot (task_7 is always image_7); "
        "status reports every slot as JSON."
    )
    placeholder = staticmethod(red_placeholder)


class ConcurrentCollectVideos(_Collector):
    SLOTS, FUTURE, OUTPUT = 10, "VIDEO_FUTURE", "VIDEO"
    DESCRIPTION = (
        "Waits for video tasks and passes them through by slot; a failed slot in "
        "placeholder mode gets a short blank clip marked as a placeholder."
    )
    placeholder = staticmethod(placeholder_clip)


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "Concurrent Collect Images (30)": ConcurrentCollectImages,
    "Concurrent Collect Videos (10)": ConcurrentCollectVideos,
}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {name: name for name in NODE_CLASS_MAPPINGS}
