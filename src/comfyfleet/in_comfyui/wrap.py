"""comfyfleet's nodes as ComfyUI node classes, minted from its registry.

Each class has the original's inputs, outputs and checks (VALIDATE_INPUTS keeps its
signature: ComfyUI reads the argument names to decide which inputs the node checks
itself) and an async function: ComfyUI's executor moves on to other nodes while it
waits. The original runs on the fan-out loop, with comfyfleet's services, ComfyUI's
folders and a node context that reports to the ComfyUI prompt; values cross the
edge through the boundary (tensors in, tensors out).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from comfyfleet.children.jobs import CHILD_JOBS, ChildJobs
from comfyfleet.engine.context import (
    InterruptProcessingException,
    NodeContext,
    reset_current_node,
    set_current_node,
)
from comfyfleet.engine.nodedef import NodeDef
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.services import using_services
from comfyfleet.fanout import FanoutService
from comfyfleet.folders import using_folders
from comfyfleet.in_comfyui.comfyui import ComfyUI
from comfyfleet.in_comfyui.control import PromptControl
from comfyfleet.in_comfyui.host import Call, FanoutHost

#: How often a waiting node looks at ComfyUI's interrupt flag (a flag, not an event).
INTERRUPT_BEAT = 0.05
#: How long an interrupted node waits for its remote jobs to be cancelled.
CANCEL_GRACE = 30.0
#: Prompts whose controls are kept (a prompt's jobs are held by the watch meanwhile).
KEPT_PROMPTS = 256
ORIGINAL_ATTRIBUTE = "ORIGINAL_NODE"
_COPIED = ("INPUT_IS_LIST", "OUTPUT_NODE", "NOT_IDEMPOTENT", "SEARCH_ALIASES", "OUTPUT_TOOLTIPS")


def exposed(registry: NodeRegistry, taken: Iterable[str]) -> list[NodeDef]:
    """comfyfleet's own nodes (providers, collectors, API settings) and the Concurrent
    Submit twins of those. Not its built-in copies of ComfyUI's image nodes (ComfyUI
    has the real ones), and never a name ComfyUI already has."""
    taken = set(taken)
    own = {
        name
        for name, node in registry.nodes.items()
        if node.python_module.startswith("comfyfleet.") and name not in taken
    }
    chosen = []
    for name, node in registry.nodes.items():
        original = getattr(node.cls, ORIGINAL_ATTRIBUTE, None)
        if name in own and (original is None or original in own):
            chosen.append(node)
    return chosen


class Bridge:
    """Runs comfyfleet's node code for ComfyUI prompts, on the fan-out loop."""

    def __init__(
        self,
        host: FanoutHost,
        service: FanoutService,
        comfy: ComfyUI,
        children: ChildJobs | None = None,
    ) -> None:
        self.host = host
        self.service = service
        self.comfy = comfy
        self._services = service.services()
        if children is not None:  # where "Run on the Fleet" sends its children
            self._services.add(CHILD_JOBS, children)
        self._controls: OrderedDict[str, PromptControl] = OrderedDict()

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """What node code reaches: the fan-out services and ComfyUI's folders."""
        with using_services(self._services), using_folders(self.comfy.folders):
            yield

    def control(self, prompt_id: str) -> PromptControl:
        found = self._controls.get(prompt_id)
        if found is None:
            found = PromptControl(prompt_id, self.comfy, asyncio.get_running_loop())
            self._controls[prompt_id] = found
            while len(self._controls) > KEPT_PROMPTS:
                self._controls.popitem(last=False)
        return found

    async def call(self, node: NodeDef, inputs: dict[str, Any]) -> Any:
        """Run the node's function for the ComfyUI node running now (on its prompt's loop)."""
        here = self.comfy.executing()
        if here is None:
            raise RuntimeError(f"{node.name} ran outside a ComfyUI prompt")
        control = self.control(here.prompt_id)
        args = {name: self.comfy.boundary.to_array(value) for name, value in inputs.items()}
        context = NodeContext(here.prompt_id, here.node_id, here.node_id, here.list_index, control)
        call = self.host.start_call(self._run(node, args, context))
        return self.comfy.boundary.result(await self._wait(call, control))

    async def _run(self, node: NodeDef, args: dict[str, Any], context: NodeContext) -> Any:
        """On the fan-out loop: the original function, in its node context."""
        with self.scope():
            token = set_current_node(context)
            try:
                function = getattr(node.cls(), node.function_name)
                if node.is_async:
                    return await function(**args)
                bound = functools.partial(contextvars.copy_context().run, function, **args)
                return await asyncio.to_thread(bound)
            except (asyncio.CancelledError, InterruptProcessingException):
                raise
            except Exception as exc:
                raise self._redacted(exc) from None
            finally:
                reset_current_node(token)

    def _redacted(self, error: Exception) -> Exception:
        """The error as ComfyUI may show and log it: no known key in its message."""
        message = str(error)
        cleaned = self.service.vault.redactor().text(message)
        if cleaned == message:
            return error
        return RuntimeError(f"{type(error).__name__}: {cleaned}")

    async def _wait(self, call: Call, control: PromptControl) -> Any:
        outcome = asyncio.wrap_future(call.outcome)
        try:
            while not outcome.done():
                await asyncio.wait([outcome], timeout=INTERRUPT_BEAT)
                if not outcome.done() and control.interrupted:
                    # ComfyUI does not stop a node it waits for: cancel it, and with it
                    # the remote jobs only this prompt waits for, then say interrupted.
                    call.cancel()
                    await asyncio.wait([outcome], timeout=CANCEL_GRACE)
                    raise self.comfy.interrupt_error()
        except asyncio.CancelledError:
            # The prompt's loop is closing (an interrupt ended the prompt elsewhere).
            if control.interrupt_seen():
                control.latch()
            call.cancel()
            raise
        if outcome.cancelled():
            raise self.comfy.interrupt_error()
        try:
            return outcome.result()
        except InterruptProcessingException:
            raise self.comfy.interrupt_error() from None
        except Exception:
            # The fan-out's own watch may see the interrupt first: its jobs end cancelled
            # and the node fails with that; ComfyUI reports an interrupt, not an error.
            if control.interrupted:
                raise self.comfy.interrupt_error() from None
            raise


def wrap(node: NodeDef, bridge: Bridge) -> type:
    """The ComfyUI class of a comfyfleet node."""
    original: Any = node.cls
    boundary = bridge.comfy.boundary

    def input_types(_cls: type) -> Any:
        with bridge.scope():
            return original.INPUT_TYPES()

    async def run(_self: Any, **inputs: Any) -> Any:
        return await bridge.call(node, inputs)

    attrs: dict[str, Any] = {
        "INPUT_TYPES": classmethod(input_types),
        "RETURN_TYPES": node.return_types,
        "RETURN_NAMES": node.return_names,
        "OUTPUT_IS_LIST": node.output_is_list,
        "FUNCTION": "run",
        "CATEGORY": node.category,
        "DESCRIPTION": node.description,
        "run": run,
    }
    attrs.update({name: getattr(original, name) for name in _COPIED if hasattr(original, name)})
    lazy = getattr(original, "check_lazy_status", None)
    if lazy is not None and not inspect.iscoroutinefunction(lazy):
        # Which lazy inputs to evaluate (the fleet nodes: none; their children make them).
        attrs["check_lazy_status"] = lambda _self, **inputs: original().check_lazy_status(**inputs)
    if node.is_changed is not None:
        attrs["IS_CHANGED"] = staticmethod(_in_scope(node.is_changed, bridge, boundary.to_array))
    if node.validate_fn is not None:
        attrs["VALIDATE_INPUTS"] = staticmethod(
            _in_scope(node.validate_fn, bridge, boundary.to_array)
        )
    return type(original.__name__, (), attrs)


def _in_scope(
    function: Callable[..., Any], bridge: Bridge, convert: Callable[[Any], Any]
) -> Callable[..., Any]:
    """`function` called with converted inputs in the bridge's scope, reporting the same
    signature (ComfyUI reads VALIDATE_INPUTS's argument names)."""

    def called(*args: Any, **kwargs: Any) -> Any:
        with bridge.scope():
            return function(*args, **{name: convert(value) for name, value in kwargs.items()})

    called.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
    return called
