"""One prompt's execution: its own progress, interrupt flag, outputs and events."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal

from comfyfleet.engine.async_calls import AsyncCalls
from comfyfleet.engine.blocker import Blocker, ExecutionBlocker
from comfyfleet.engine.cache import OutputCache
from comfyfleet.engine.cache_lookup import CacheLookup
from comfyfleet.engine.calls import (
    NodeReturns,
    blocker_in,
    call_arguments,
    gather_inputs,
    merge_outputs,
    split_returns,
)
from comfyfleet.engine.context import (
    InterruptProcessingException,
    NodeContext,
    reset_current_node,
    set_current_node,
)
from comfyfleet.engine.dynamic import DynamicPrompt
from comfyfleet.engine.events import EventSink, Message
from comfyfleet.engine.expansion import PendingExpansion, add_subgraph, use_builder_prefix
from comfyfleet.engine.failures import FailureReport, Interrupted, NodeFailure
from comfyfleet.engine.graph import DependencyCycleError, PendingGraph
from comfyfleet.engine.node_control import NodeControl
from comfyfleet.engine.nodedef import InputTypes, NodeDef
from comfyfleet.engine.progress import ProgressTracker
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.protocol import events
from comfyfleet.protocol.prompt import Prompt, is_large, is_link

log = logging.getLogger(__name__)

Status = Literal["success", "error", "interrupted"]


@dataclass(frozen=True)
class ExecutionRequest:
    """A validated prompt and the output nodes to run."""

    prompt_id: str
    prompt: Prompt
    outputs: list[str]
    extra_data: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExecutionResult:
    """How a prompt ended, in the pieces a ComfyUI history entry is made of."""

    prompt_id: str
    status: Status
    outputs: dict[str, Any]
    meta: dict[str, Any]
    messages: list[list[Any]]
    executed: list[str]
    error: dict[str, Any] | None = None

    @property
    def completed(self) -> bool:
        return self.status == "success"

    def status_record(self) -> dict[str, Any]:
        """`status` of a history entry: `{status_str, completed, messages}`."""
        return {
            "status_str": "success" if self.completed else "error",
            "completed": self.completed,
            "messages": self.messages,
        }


#: How often a run held back by `may_proceed` alone looks again (s).
HELD_BACK_LOOK = 0.1


class RunHandle:
    """Interrupts or holds back exactly one prompt; callable from any thread.

    A prompt is held back while paused, or while `may_proceed()` says no (the gateway
    cannot prove its lease: a clock reading, true even before any callback ran). Held
    back, it starts no node, and a node that looks whether it is interrupted is told it
    is: it stops, and runs again from its start once resumed (its partial run was never
    a result). `stop()` also cancels the async calls of a paused prompt, which then run
    again the same way. `quiet` says whether nothing runs now: paused with no node under
    way, or not running at all."""

    def __init__(self) -> None:
        self._interrupted = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        self._paused = False
        self._pause_listeners: list[Callable[[], None]] = []
        self._stop_listeners: list[Callable[[], None]] = []
        self.may_proceed: Callable[[], bool] = lambda: True
        self.quiet = True  # kept by the run (see above)

    @property
    def held_back(self) -> bool:
        return self._paused or not self.may_proceed()

    @property
    def interrupted(self) -> bool:
        return self._interrupted.is_set()

    def interrupt(self) -> None:
        self._interrupted.set()
        for listener in list(self._listeners):
            listener()

    def on_interrupt(self, listener: Callable[[], None]) -> None:
        """Call `listener` on interrupt (at once if the prompt was interrupted already)."""
        self._listeners.append(listener)
        if self.interrupted:
            listener()

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        self._set_paused(True)

    def resume(self) -> None:
        self._set_paused(False)

    def on_pause_change(self, listener: Callable[[], None]) -> None:
        self._pause_listeners.append(listener)

    def stop(self) -> None:
        """Cancel what a paused prompt's async nodes are doing (they run again)."""
        if self._paused:
            for listener in list(self._stop_listeners):
                listener()

    def on_stop(self, listener: Callable[[], None]) -> None:
        self._stop_listeners.append(listener)

    def _set_paused(self, paused: bool) -> None:
        self._paused = paused
        for listener in list(self._pause_listeners):
            listener()


async def _call_async(
    fn: Callable[..., Any], kwargs: dict[str, Any], node_id: str, index: int
) -> Any:
    use_builder_prefix(node_id, index)  # in the call's first step, right before its code
    return await fn(**kwargs)


class PromptRun:
    """Runs one prompt: its nodes in dependency order, async ones side by side."""

    def __init__(
        self,
        registry: NodeRegistry,
        cache: OutputCache,
        executor: Executor,
        request: ExecutionRequest,
        sink: EventSink,
        handle: RunHandle,
    ) -> None:
        self.registry = registry
        self.executor = executor
        self.request = request
        self.prompt_id = request.prompt_id
        self.prompt = request.prompt  # as submitted
        self.dynprompt = DynamicPrompt(request.prompt)
        self.nodes = self.dynprompt.nodes  # as submitted, plus what expansions add
        self.handle = handle
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self.tracker = ProgressTracker(self.prompt_id, self._emit, self.dynprompt)
        self.messages: list[list[Any]] = []
        self.values: dict[str, list[list[Any]]] = {}
        self.ui: dict[str, dict[str, Any]] = {}
        self.executed: list[str] = []
        extra = request.extra_data
        self.lookup = CacheLookup(
            registry, cache, self.dynprompt, extra, self.node_of, self.types_of
        )
        self.hits = self.lookup.hits
        self._types: dict[str, InputTypes] = {}
        self._wake = asyncio.Event()
        self.calls = AsyncCalls(self._wake.set)
        self.report = FailureReport(self.prompt_id, self.prompt, self.dynprompt)
        self._expanded: dict[str, PendingExpansion] = {}
        self._current: str | None = None
        self.control = NodeControl(self.prompt_id, handle, self.tracker, self._emit)

    # -- events -----------------------------------------------------------

    def _emit(self, event: Any) -> None:
        try:
            self._sink(event)
        except Exception:  # a broken listener must not break the prompt
            log.exception("event sink failed", extra={"prompt_id": self.prompt_id})

    def _record(self, event: str, data: dict[str, Any]) -> None:
        data = {**data, "timestamp": events.timestamp_ms()}
        self.messages.append([event, data])
        self._emit(Message(event, data))

    # -- helpers ----------------------------------------------------------

    def node_of(self, node_id: str) -> NodeDef:
        node = self.registry.get(self.nodes[node_id]["class_type"])
        if node is None:
            raise KeyError(f"node class {self.nodes[node_id]['class_type']!r} is not registered")
        return node

    def types_of(self, node_id: str) -> InputTypes:
        class_type = self.nodes[node_id]["class_type"]
        types = self._types.get(class_type)
        if types is None:
            types = self._types[class_type] = self.node_of(node_id).input_types()
        return types

    def context_for(self, node_id: str, index: int | None) -> NodeContext:
        display = self.dynprompt.get_display_node_id(node_id)
        return NodeContext(self.prompt_id, node_id, display, index, self.control)

    # -- the run ----------------------------------------------------------

    async def run(self) -> ExecutionResult:
        self._record("execution_start", {"prompt_id": self.prompt_id})
        self.handle.on_interrupt(lambda: self.control.on_loop(self._cancel_inflight))
        self.handle.on_pause_change(lambda: self.control.on_loop(self._wake.set))
        self.handle.on_stop(lambda: self.control.on_loop(self._stop_inflight))
        self.handle.quiet = False
        failure: dict[str, Any] | None = None
        status: Status = "success"
        try:
            await self._look_up_cache(list(self.prompt))
            self._record(
                "execution_cached", {"nodes": list(self.hits), "prompt_id": self.prompt_id}
            )
            await self._drive()
            self._record("execution_success", {"prompt_id": self.prompt_id})
        except Interrupted as stop:
            status = "interrupted"
            failure = self.report.interrupted(stop.node_id, self.executed)
            self._record("execution_interrupted", failure)
        except NodeFailure as fail:
            status = "error"
            failure = self.report.error(fail, self.executed, self.values)
            log.warning(
                "prompt %s: node %s (%s) failed: %s",
                self.prompt_id,
                failure["node_id"],
                failure["node_type"],
                failure["exception_message"].rstrip(),
                exc_info=fail.exc,
            )
            self._record("execution_error", failure)
        finally:
            await self._cancel_inflight_and_wait()
            self.handle.quiet = True
        result = ExecutionResult(
            prompt_id=self.prompt_id,
            status=status,
            outputs={n: u["output"] for n, u in self.ui.items()},
            meta={n: u["meta"] for n, u in self.ui.items()},
            messages=self.messages,
            executed=list(self.executed),
            error=failure,
        )
        self._emit(Message("executing", events.executing(self.prompt_id, None)))
        return result

    async def _look_up_cache(self, node_ids: list[str]) -> None:
        for node_id, entry in (await self.lookup.look_up(node_ids, self._in_thread)).items():
            self.values[node_id] = entry.outputs

    async def _in_thread(self, fn: Callable[[], Any]) -> Any:
        context = contextvars.copy_context()
        return await self._loop.run_in_executor(self.executor, context.run, fn)

    async def _drive(self) -> None:
        graph = PendingGraph(self.nodes, self.node_of, self.types_of, self._has_value)

        def lay_out() -> None:
            for output in self.request.outputs:
                graph.add(output)

        if is_large(self.nodes):  # a walk of every node (INPUT_TYPES too)
            await self._in_thread(lay_out)
        else:
            lay_out()
        while graph.pending:
            while self.calls.ended:
                node_id = self.calls.ended.popleft()
                if node_id in self.calls.inflight:  # not taken at once by its own step
                    try:
                        self.calls.collect(node_id)
                    except Interrupted as stop:
                        self._set_back(stop)
                    graph.release(node_id)
            ready = graph.ready()
            if self.handle.interrupted:
                busy = next(iter(self.calls.inflight), None)
                raise Interrupted(busy or (graph.pick(ready) if ready else self._current or ""))
            if ready and self.handle.held_back:
                # No node starts until resumed (woken then), or `may_proceed` says yes.
                self.handle.quiet = not self.calls.inflight
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), HELD_BACK_LOOK)
                continue
            if not ready:
                if not self.calls.inflight:
                    error = DependencyCycleError("Dependency cycle detected")
                    raise NodeFailure(self._blame(graph.cycle()), error, {})
                self._wake.clear()
                await self._wake.wait()
                continue
            node_id = graph.pick(ready)
            self._current = node_id
            self.handle.quiet = False
            try:
                if await self._step(node_id, graph):
                    graph.done(node_id)
            except Interrupted as stop:
                self._set_back(stop)

    def _set_back(self, stop: Interrupted) -> None:
        """A node stopped: the run ends if interrupted; if only held back, the node is
        left as not run (still ready), to run again from its start once resumed."""
        if self.handle.interrupted or not self.control.told_held_back:
            raise stop
        self.control.told_held_back = False

    def _has_value(self, node_id: str) -> bool:
        return node_id in self.values

    def _blame(self, cycle: list[str]) -> str:
        """The node a dynamic cycle is reported on: the one that expanded into it, if any
        (as ComfyUI reports it: a cycle of submitted nodes fails validation)."""
        for node_id in cycle:
            display = self.dynprompt.get_display_node_id(node_id)
            if display != node_id:
                return display
        return cycle[0]

    async def _step(self, node_id: str, graph: PendingGraph) -> bool:
        """Advance one node; True when it is done, False while it waits."""
        node = self.node_of(node_id)
        if node_id in self._expanded:
            self._finish_expanded(node_id, node)
            return True
        if node_id in self.calls.returns:
            return await self._finish(node_id, node, self.calls.returns.pop(node_id), {}, graph)
        if node_id in self.hits:
            self._replay_cached(node_id)
            return True
        self.tracker.start(node_id)
        display = self.dynprompt.get_display_node_id(node_id)
        self._emit(Message("executing", events.executing(self.prompt_id, node_id, display)))
        inputs: dict[str, list[Any]] = {}
        try:
            gathered = gather_inputs(
                node_id,
                self.nodes[node_id].get("inputs", {}),
                self.types_of(node_id),
                self.values,
                self.dynprompt,
                self.request.extra_data,
            )
            inputs = gathered.values
            if node.has_lazy_status:
                wanted = await self._lazy_wanted(node_id, node, gathered.values, gathered.missing)
                if wanted:
                    for name in wanted:
                        graph.require(node_id, name)
                    return False
            calls = call_arguments(gathered.values, node.input_is_list)
            if node.is_async:
                self._start_async(node_id, node, calls)
                # Let the calls take their first step now, as ComfyUI does; quick ones finish.
                await asyncio.sleep(0)
                if not self.calls.all_done(node_id):
                    graph.hold(node_id)
                    return False
                self.calls.collect(node_id)
                returns = self.calls.returns.pop(node_id)
            else:
                returns = await self._in_thread(lambda: self._call_sync(node_id, node, calls))
        except (Interrupted, NodeFailure):
            raise
        except (InterruptProcessingException, asyncio.CancelledError):
            raise Interrupted(node_id) from None
        except Exception as exc:
            raise NodeFailure(node_id, exc, inputs) from exc
        return await self._finish(node_id, node, returns, inputs, graph)

    def _call_sync(self, node_id: str, node: NodeDef, calls: list[dict[str, Any]]) -> list[Any]:
        """Runs in a worker thread: one call per list index, each with its node context."""
        fn = getattr(node.cls(), node.function_name)
        returns: list[Any] = []
        for index, kwargs in enumerate(calls):
            if self.handle.interrupted:
                raise InterruptProcessingException()
            blocked = blocker_in(kwargs, node.input_is_list)
            if blocked is not None:
                returns.append(self._blocked(node_id, node, blocked))
                continue
            token = set_current_node(self.context_for(node_id, index))
            try:
                use_builder_prefix(node_id, index)
                returns.append(fn(**kwargs))
            finally:
                reset_current_node(token)
        return returns

    def _start_async(self, node_id: str, node: NodeDef, calls: list[dict[str, Any]]) -> None:
        fn = getattr(node.cls(), node.function_name)
        started: list[asyncio.Future[Any]] = []
        for index, kwargs in enumerate(calls):
            blocked = blocker_in(kwargs, node.input_is_list)
            if blocked is not None:
                started.append(self.calls.resolved(self._blocked(node_id, node, blocked)))
            else:
                call = _call_async(fn, kwargs, node_id, index)
                started.append(self.calls.spawn(call, self.context_for(node_id, index)))
        self.calls.track(node_id, started)

    async def _lazy_wanted(
        self, node_id: str, node: NodeDef, values: dict[str, list[Any]], missing: set[str]
    ) -> list[str]:
        """Ask `check_lazy_status` which lazy inputs it needs that are not there yet."""
        obj = node.cls()
        calls = call_arguments(values, node.input_is_list)
        check = obj.check_lazy_status
        if asyncio.iscoroutinefunction(check):
            answers = [await check(**kwargs) for kwargs in calls]
        else:
            answers = await self._in_thread(lambda: [check(**kwargs) for kwargs in calls])
        names = {name for answer in answers if isinstance(answer, list) for name in answer}
        return [n for n in names if isinstance(n, str) and (n not in values or n in missing)]

    def _blocked(self, node_id: str, node: NodeDef, blocker: Blocker) -> Blocker:
        """A blocker with a message reports it once, as ComfyUI does, then goes silent."""
        if blocker.message is None:
            return blocker
        payload = self.report.blocked(node_id, node.name, blocker.message, self.executed)
        self.control.on_loop(self._emit, Message("execution_error", payload))
        return ExecutionBlocker(None)

    async def _finish(
        self,
        node_id: str,
        node: NodeDef,
        returns: list[Any],
        inputs: dict[str, list[Any]],
        graph: PendingGraph,
    ) -> bool:
        """Take a node's returns: done, or False while the subgraph it returned runs."""
        try:
            split = split_returns(node, returns)
            if split.subgraphs:
                if split.ui:  # shown now, as ComfyUI does; cached with the outputs later
                    self._show(node_id, split.ui)
                await self._expand(node_id, split, graph)
                return False
            outputs = merge_outputs(node, split.calls, self._linked)
        except (Interrupted, NodeFailure):
            raise
        except Exception as exc:
            raise NodeFailure(node_id, exc, inputs) from exc
        if split.ui:
            self._show(node_id, split.ui)
        self._complete(node_id, outputs, split.ui)
        return True

    async def _expand(self, parent: str, split: NodeReturns, graph: PendingGraph) -> None:
        """Add the nodes `parent` returned; its output nodes and its result links run."""
        new_ids: list[str] = []
        for subgraph in split.subgraphs:
            new_ids += add_subgraph(self.dynprompt, self.registry, parent, subgraph)
        await self._look_up_cache(new_ids)
        for node_id in new_ids:
            if self.node_of(node_id).is_output:
                graph.add(node_id)
        self._expanded[parent] = PendingExpansion(split.calls, split.ui)
        for call in split.calls:
            for value in call.values if call.expanded else ():
                if is_link(value):
                    graph.depend(parent, value[0])

    def _finish_expanded(self, node_id: str, node: NodeDef) -> None:
        """The subgraph has run: the node's outputs are what its result links hold."""
        pending = self._expanded.pop(node_id)
        try:
            outputs = merge_outputs(node, pending.calls, self._linked)
        except Exception as exc:
            raise NodeFailure(node_id, exc, {}) from exc
        self._complete(node_id, outputs, pending.ui)

    def _linked(self, link: list[Any]) -> list[Any]:
        source, index = link[0], int(link[1])
        produced = self.values.get(source)
        if produced is None or not 0 <= index < len(produced):
            raise LookupError(f"node {source} has no output {index} to give as a result")
        return produced[index]

    def _complete(self, node_id: str, outputs: list[list[Any]], ui: dict[str, Any]) -> None:
        self.values[node_id] = outputs
        self.tracker.finish(node_id)
        self.executed.append(node_id)
        self.lookup.put(node_id, outputs, ui or None)

    def _replay_cached(self, node_id: str) -> None:
        ui = self.hits[node_id].ui
        if ui:
            self._show(node_id, ui)
        else:
            self._executed(node_id, None)
        self.tracker.finish(node_id)

    def _show(self, node_id: str, ui: dict[str, Any]) -> None:
        dyn = self.dynprompt
        meta = events.node_meta(
            node_id,
            dyn.get_display_node_id(node_id),
            dyn.get_parent_node_id(node_id),
            dyn.get_real_node_id(node_id),
        )
        self.ui[node_id] = {"meta": meta, "output": ui}
        self._executed(node_id, ui)

    def _executed(self, node_id: str, ui: dict[str, Any] | None) -> None:
        display = self.dynprompt.get_display_node_id(node_id)
        self._emit(Message("executed", events.executed(self.prompt_id, node_id, ui, display)))

    # -- endings ----------------------------------------------------------

    def _stop_inflight(self) -> None:
        if self.calls.started_any and self.handle.held_back:
            self.control.told_held_back = True
            self._cancel_inflight()

    def _cancel_inflight(self) -> None:
        self.calls.cancel()
        self._wake.set()  # a paused run, waiting for nothing in flight, ends too

    async def _cancel_inflight_and_wait(self) -> None:
        self._wake.set()
        await self.calls.cancel_and_wait()
