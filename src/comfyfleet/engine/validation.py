"""Prompt validation with ComfyUI 0.3.64's rules, error types and response shapes.

ComfyUI's `validate_inputs` calls itself for every linked node, so a long chain
exhausts the stack and a cycle never ends. Here each node's checks run as a
generator that yields the id of every node it links to; a driver keeps the
generators on an explicit stack. The checks therefore run in ComfyUI's order,
record results in ComfyUI's order, and an exception crosses exactly one link as
it does there, at any depth. Cycles are found first, statically, and reported as
an error of their own (ComfyUI reports none).

The whole validation is one generator too, which yields only what must be awaited
(an async VALIDATE_INPUTS). A large prompt (protocol.prompt.is_large) is validated
in a worker thread, each awaitable sent to the event loop and waited for there, so
no client waits on the loop while a large prompt is checked.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
from collections.abc import Awaitable, Generator, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from comfyfleet.engine.blocker import is_blocker
from comfyfleet.engine.nodedef import InputInfo, InputTypes, NodeDef
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.errors import error, full_type_name
from comfyfleet.protocol.prompt import is_large, is_link

log = logging.getLogger(__name__)

Prompt = dict[str, dict[str, Any]]
ErrorDict = dict[str, Any]

# What a constant of these declared types is converted with, as ComfyUI does.
_CONVERTERS: dict[str, Any] = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}

# Hidden inputs VALIDATE_INPUTS may ask for. ComfyUI validates without a dynamic
# prompt or extra data, so PROMPT is `{}` and the others are None at this stage.
_HIDDEN_AT_VALIDATION: dict[str, Any] = {
    "PROMPT": {},
    "DYNPROMPT": None,
    "EXTRA_PNGINFO": None,
    "AUTH_TOKEN_COMFY_ORG": None,
    "API_KEY_COMFY_ORG": None,
}

# ComfyUI elides combo lists longer than this from `value_not_in_list` errors;
# cycle listings are elided the same way.
_MAX_LISTED = 20


@dataclass(frozen=True)
class ValidationResult:
    ok: bool  # False -> HTTP 400 with {error, node_errors}
    error: ErrorDict | None  # whole-prompt error {type, message, details, extra_info}
    outputs: list[str]  # output node ids that validated (to execute)
    node_errors: dict[str, Any]  # {node_id: {errors, dependent_outputs, class_type}}
    prompt: Prompt  # normalized deep copy: constants converted, {"__value__": v} unwrapped

    def __repr__(self) -> str:
        # Short on purpose: asyncio formats task results into some messages, and a
        # full repr of a large prompt costs seconds.
        kind = self.error["type"] if self.error else None
        return (
            f"ValidationResult(ok={self.ok}, error={kind!r}, outputs={self.outputs!r}, "
            f"node_errors={list(self.node_errors)!r}, nodes={len(self.prompt)})"
        )


@dataclass(frozen=True)
class _NodeResult:
    ok: bool
    errors: list[ErrorDict]


@dataclass(frozen=True)
class _Pending:
    """An awaitable a node's checks need awaited (an async VALIDATE_INPUTS)."""

    awaitable: Awaitable[Any]


@dataclass(frozen=True)
class _Outcome:
    """What a `_Pending` awaitable gave: its value, or the exception it raised."""

    value: Any = None
    error: Exception | None = None


# A node's checks: they yield linked node ids (sent back: is that node valid?)
# and `_Pending` awaitables (sent back: the awaited result).
_Checks = Generator["str | _Pending", Any, None]
# The whole validation: it yields what must be awaited, and is sent its `_Outcome`.
_Steps = Generator[_Pending, _Outcome, "ValidationResult"]


@dataclass(frozen=True)
class _ClassInputs:
    types: InputTypes
    declared: list[InputInfo]  # required then optional, in declaration order


class _CycleError(ComfyfleetError, RuntimeError):
    """A link back into a node still being validated (the static check prevents it)."""


async def validate_prompt(
    registry: NodeRegistry, prompt: Any, partial_targets: list[str] | None = None
) -> ValidationResult:
    """Validate an API-format prompt; never raises for any JSON-shaped input."""
    try:
        steps = _validate(registry, prompt, partial_targets)
        if is_large(prompt):
            loop = asyncio.get_running_loop()
            return await asyncio.to_thread(_drive_in_thread, steps, loop)
        return await _drive(steps)
    except Exception as exc:  # a bug here must surface as a rejection, not a 500
        log.exception("prompt validation failed unexpectedly")
        whole = _exception_error(exc)
        whole["message"] = "Exception when validating prompt"
        return _rejected(whole, {})


async def _drive(steps: _Steps) -> ValidationResult:
    """Run the validation on the event loop, awaiting what it asks for."""
    outcome: _Outcome | None = None
    while not isinstance(asked := _resume(steps, outcome), ValidationResult):
        outcome = await _settled(asked.awaitable)
    return asked


def _drive_in_thread(steps: _Steps, loop: asyncio.AbstractEventLoop) -> ValidationResult:
    """Run the validation on this worker thread; what it awaits runs on `loop`."""
    outcome: _Outcome | None = None
    while not isinstance(asked := _resume(steps, outcome), ValidationResult):
        outcome = asyncio.run_coroutine_threadsafe(_settled(asked.awaitable), loop).result()
    return asked


def _resume(steps: _Steps, outcome: _Outcome | None) -> _Pending | ValidationResult:
    """The next awaitable the validation asks for, or its result (None starts it)."""
    try:
        return steps.send(outcome)  # type: ignore[arg-type]
    except StopIteration as done:
        result: ValidationResult = done.value
        return result


async def _settled(awaitable: Awaitable[Any]) -> _Outcome:
    try:
        return _Outcome(await awaitable)
    except Exception as exc:
        return _Outcome(error=exc)


def _validate(registry: NodeRegistry, prompt: Any, partial_targets: Any) -> _Steps:
    problem = _shape_error(prompt, partial_targets)
    if problem is not None:
        return _rejected(problem, {})
    problem = _class_error(registry, prompt)
    if problem is not None:
        return _rejected(problem, _normalize(prompt))
    normalized = _normalize(prompt)
    outputs = [
        node_id
        for node_id, node in normalized.items()
        if _node_def(registry, node).is_output
        and (partial_targets is None or node_id in partial_targets)
    ]
    if not outputs:
        return _rejected(error("prompt_no_outputs", "Prompt has no outputs"), normalized)
    cycle = _cycle_report(normalized, outputs)
    if cycle is not None:
        return _rejected(cycle[0], normalized, cycle[1])
    return (yield from _Validator(registry, normalized).run(outputs))


def _rejected(
    err: ErrorDict, prompt: Prompt, node_errors: dict[str, Any] | None = None
) -> ValidationResult:
    return ValidationResult(False, err, [], node_errors or {}, prompt)


def _node_def(registry: NodeRegistry, node: dict[str, Any]) -> NodeDef:
    return registry.nodes[node["class_type"]]


# --- whole-prompt checks -------------------------------------------------------------


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    if type(value) in names:
        return names[type(value)]
    return "number" if isinstance(value, int | float) else type(value).__name__


def _shape_error(prompt: Any, partial_targets: Any) -> ErrorDict | None:
    """Shapes ComfyUI does not check at all (it fails with a 500 on them)."""
    if not isinstance(prompt, dict):
        return error(
            "invalid_prompt",
            "Cannot execute because the prompt is not an object of nodes.",
            f"Expected an object mapping node ids to nodes, got {_json_type(prompt)}",
        )
    for node_id in prompt:
        if not isinstance(node_id, str):
            return error(
                "invalid_prompt",
                "Cannot execute because a node id is not a string.",
                f"Node ID '#{node_id}'",
            )
    if partial_targets is not None and not isinstance(partial_targets, list):
        return error(
            "invalid_prompt",
            "partial_execution_targets must be a list of node ids.",
            f"Expected an array, got {_json_type(partial_targets)}",
        )
    return None


def _class_error(registry: NodeRegistry, prompt: dict[str, Any]) -> ErrorDict | None:
    """Every node needs a known class_type; the first offender in prompt order is reported."""
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or "class_type" not in node:
            return error(
                "invalid_prompt",
                "Cannot execute because a node is missing the class_type property.",
                f"Node ID '#{node_id}'",
            )
        class_type = node["class_type"]
        if not isinstance(class_type, str) or registry.get(class_type) is None:
            return error(
                "invalid_prompt",
                f"Cannot execute because node {class_type} does not exist.",
                f"Node ID '#{node_id}'",
            )
    return None


def _copy_json(value: Any) -> Any:
    """Deep-copy dicts and lists without recursion (shared and cyclic parts stay so)."""
    if not isinstance(value, dict | list):
        return value
    memo: dict[int, Any] = {}

    def shell(item: Any) -> Any:
        if id(item) not in memo:
            memo[id(item)] = {} if isinstance(item, dict) else [None] * len(item)
            pending.append(item)
        return memo[id(item)]

    pending: list[Any] = []
    top = shell(value)
    while pending:
        source = pending.pop()
        target = memo[id(source)]
        pairs = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in pairs:
            target[key] = shell(item) if isinstance(item, dict | list) else item
    return top


def _copy_value(value: Any) -> Any:
    """`_copy_json` with a shortcut for the usual scalars and `[id, slot]` links."""
    if isinstance(value, list) and len(value) == 2:
        first, second = value
        if not isinstance(first, dict | list) and not isinstance(second, dict | list):
            return [first, second]
    return _copy_json(value)


def _normalize(prompt: dict[str, Any]) -> Prompt:
    """A private copy whose nodes are dicts with an `inputs` dict, for checks to convert in."""
    normalized: Prompt = {}
    for node_id, node in prompt.items():
        if not isinstance(node, dict):
            normalized[node_id] = {"inputs": {}}
            continue
        copied = {key: _copy_value(value) for key, value in node.items()}
        inputs = node.get("inputs")
        if isinstance(inputs, dict):
            copied["inputs"] = {name: _copy_value(value) for name, value in inputs.items()}
        else:
            copied["inputs"] = {}
        normalized[node_id] = copied
    return normalized


# --- static cycle detection ----------------------------------------------------------


def _link_target(prompt: Prompt, value: Any) -> str | None:
    """The node a value links to, for graph walks: any `[id, number]` naming a node.

    Booleans count as numbers here because validation follows `["1", true]` too.
    """
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int | float)
        and value[0] in prompt
    ):
        return value[0]
    return None


def _link_graph(prompt: Prompt) -> dict[str, list[str]]:
    """Every node's link targets, over all inputs: lazy and undeclared ones run too."""
    graph: dict[str, list[str]] = {}
    for node_id, node in prompt.items():
        targets = (_link_target(prompt, value) for value in node["inputs"].values())
        graph[node_id] = [target for target in targets if target is not None]
    return graph


def _cycles(graph: dict[str, list[str]], roots: Iterable[str]) -> list[list[str]]:
    """Strongly connected components that form cycles, by Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    work: list[tuple[str, Any]] = []  # the depth-first path, each with its successor iterator

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        work.append((node, iter(graph[node])))

    for root in roots:
        if root in index:
            continue
        enter(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    enter(successor)
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = _pop_component(stack, on_stack, node)
                    if len(component) > 1 or node in graph[node]:
                        found.append(component)
    return found


def _pop_component(stack: list[str], on_stack: set[str], root: str) -> list[str]:
    component: list[str] = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == root:
            return component


def _reverse(graph: dict[str, list[str]]) -> dict[str, list[str]]:
    reverse: dict[str, list[str]] = {node: [] for node in graph}
    for node, successors in graph.items():
        for successor in successors:
            reverse[successor].append(node)
    return reverse


def _reaching(reverse: dict[str, list[str]], targets: Iterable[str]) -> set[str]:
    """Every node from which one of `targets` can be reached (the targets included)."""
    seen = set(targets)
    pending = list(seen)
    while pending:
        for predecessor in reverse[pending.pop()]:
            if predecessor not in seen:
                seen.add(predecessor)
                pending.append(predecessor)
    return seen


def _cycle_details(members: list[str]) -> str:
    """Names the nodes, eliding long cycles as ComfyUI elides long combo lists."""
    listed = ", ".join(f"#{node_id}" for node_id in members[:_MAX_LISTED])
    if len(members) > _MAX_LISTED:
        listed += f", ... ({len(members)} nodes)"
    return f"Nodes in cycle: {listed}"


def _cycle_report(prompt: Prompt, outputs: list[str]) -> tuple[ErrorDict, dict[str, Any]] | None:
    """The `dependency_cycle` error and node_errors, if the outputs depend on a cycle."""
    graph = _link_graph(prompt)
    components = _cycles(graph, outputs)
    if not components:
        return None
    order = {node_id: position for position, node_id in enumerate(prompt)}
    reverse = _reverse(graph)
    node_errors: dict[str, Any] = {}
    for component in components:
        component.sort(key=order.__getitem__)
        reaching = _reaching(reverse, component)
        dependents = [output for output in outputs if output in reaching]
        # One error object per cycle, shared by its nodes: a long cycle would
        # otherwise cost time and memory quadratic in its length.
        shared = error(
            "dependency_cycle",
            "Dependency cycle detected",
            _cycle_details(component),
            nodes=component,
        )
        for node_id in component:
            node_errors[node_id] = {
                "errors": [shared],
                "dependent_outputs": list(dependents),
                "class_type": prompt[node_id]["class_type"],
            }
    members = sorted(node_errors, key=order.__getitem__)
    whole = error(
        "dependency_cycle",
        "Prompt contains a dependency cycle",
        _cycle_details(members),
        nodes=members,
    )
    return whole, {node_id: node_errors[node_id] for node_id in members}


# --- type compatibility --------------------------------------------------------------


def _is_combo(type_: Any) -> bool:
    return isinstance(type_, list) or (isinstance(type_, str) and type_ == "COMBO")


def types_compatible(received: Any, expected: Any) -> bool:
    """Whether an output of type `received` may feed an input of type `expected`.

    ComfyUI's rule: equal, or comma-separated unions that overlap. `not a != b`
    keeps honouring custom `__ne__` overrides. ComfyUI gets wildcards from custom
    nodes' `AnyType(str)` whose `__ne__` always says "equal"; a plain "*" on
    either side stands in for that trick here. A combo input (a list of options,
    or "COMBO") takes a link from a "COMBO" output or an output typed by a list.
    """
    if not (received != expected):  # noqa: SIM202 - `!=` is what AnyType overrides
        return True
    if _is_combo(expected):
        return _is_combo(received) or (isinstance(received, str) and received == "*")
    if not isinstance(received, str) or not isinstance(expected, str):
        return False
    got = {part.strip() for part in received.split(",")}
    wanted = {part.strip() for part in expected.split(",")}
    return "*" in got or "*" in wanted or not got.isdisjoint(wanted)


# --- per-node checks -----------------------------------------------------------------


def _text(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _exception_error(exc: BaseException) -> ErrorDict:
    return error(
        "exception_during_validation",
        "Exception when validating node",
        _text(exc),
        exception_type=full_type_name(type(exc)),
        traceback=traceback.format_tb(exc.__traceback__),
    )


def _inner_exception(info: InputInfo, link: Any, exc: BaseException) -> _NodeResult:
    """What the node that links to a failing node records on it (ComfyUI's shape)."""
    message = _text(exc)
    return _NodeResult(
        False,
        [
            error(
                "exception_during_inner_validation",
                "Exception when validating inner node",
                message,
                input_name=info.name,
                input_config=info.config,
                exception_message=message,
                exception_type=full_type_name(type(exc)),
                traceback=traceback.format_tb(exc.__traceback__),
                linked_node=link,
            )
        ],
    )


def _value_error(type_: str, message: str, info: InputInfo, value: Any) -> ErrorDict:
    return error(
        type_,
        message,
        info.name,
        input_name=info.name,
        input_config=info.config,
        received_value=value,
    )


def _range_error(info: InputInfo, value: Any) -> ErrorDict | None:
    """min/max from the input's options; comparing a wrong type raises, as in ComfyUI."""
    options = info.options
    if "min" in options and value < options["min"]:
        message = f"Value {value} smaller than min of {options['min']}"
        return _value_error("value_smaller_than_min", message, info, value)
    if "max" in options and value > options["max"]:
        message = f"Value {value} bigger than max of {options['max']}"
        return _value_error("value_bigger_than_max", message, info, value)
    return None


def _combo_error(info: InputInfo, value: Any) -> ErrorDict | None:
    """Only list-typed combos are checked, as in ComfyUI: a "COMBO" input (V3 style)
    may be multiselect, and ComfyUI leaves its value to the node."""
    options = info.type
    if not isinstance(options, list) or value in options:
        return None
    config: Any = info.config
    if len(options) > _MAX_LISTED:
        listed = f"(list of length {len(options)})"
        config = None
    else:
        listed = str(options)
    return error(
        "value_not_in_list",
        "Value not in list",
        f"{info.name}: '{value}' not in {listed}",
        input_name=info.name,
        input_config=config,
        received_value=value,
    )


def _check_constant(node: NodeDef, info: InputInfo, inputs: dict[str, Any]) -> ErrorDict | None:
    """Unwrap and convert a constant in place, then check its range and combo list."""
    name = info.name
    value = inputs[name]
    try:
        if isinstance(value, dict) and "__value__" in value:
            value = inputs[name] = value["__value__"]
        convert = _CONVERTERS.get(info.type) if isinstance(info.type, str) else None
        if convert is not None:
            value = inputs[name] = convert(value)
    except Exception as exc:
        return error(
            "invalid_input_type",
            f"Failed to convert an input value to a {info.type} value",
            f"{name}, {value}, {_text(exc)}",
            input_name=name,
            input_config=info.config,
            received_value=value,
            exception_message=_text(exc),
        )
    # A node that validates an input itself turns the built-in checks off for it.
    if name in node.validate_args or node.validate_has_kwargs:
        return None
    if node.ranges_checked_elsewhere:
        return _combo_error(info, value)
    return _range_error(info, value) or _combo_error(info, value)


class _Validator:
    """One validate_prompt call: results per node, links followed, INPUT_TYPES per class."""

    def __init__(self, registry: NodeRegistry, prompt: Prompt) -> None:
        self.registry = registry
        self.prompt = prompt
        self.validated: dict[str, _NodeResult] = {}  # in the order nodes finished
        self.links: dict[str, list[str]] = {}
        self._running: set[str] = set()
        self._types: dict[str, _ClassInputs | tuple[Exception, TracebackType | None]] = {}

    def run(self, outputs: list[str]) -> _Steps:
        good: list[str] = []
        failed: list[str] = []
        for output in outputs:
            result = yield from self._validate_output(output)
            (good if result.ok else failed).append(output)
        node_errors = self._node_errors(failed)
        if good:
            return ValidationResult(True, None, good, node_errors, self.prompt)
        # ComfyUI lists only the outputs' own errors here, so it is often "".
        details = "\n".join(
            f"{reason['message']}: {reason['details']}"
            for output in failed
            for reason in self.validated[output].errors
        )
        whole = error(
            "prompt_outputs_failed_validation", "Prompt outputs failed validation", details
        )
        return ValidationResult(False, whole, [], node_errors, self.prompt)

    def _validate_output(self, output: str) -> Generator[_Pending, _Outcome, _NodeResult]:
        if output not in self.validated:
            try:
                yield from self._walk(output)
            except Exception as exc:
                self.validated[output] = _NodeResult(False, [_exception_error(exc)])
        return self.validated[output]

    def _node_errors(self, failed: list[str]) -> dict[str, Any]:
        """Nodes with errors of their own, each with the failing outputs that depend on it."""
        erroring = [node_id for node_id, result in self.validated.items() if result.errors]
        node_errors: dict[str, Any] = {}
        for output in failed:
            reachable = self._reachable(output)
            for node_id in erroring:
                if node_id not in reachable:
                    continue
                if node_id not in node_errors:
                    node_errors[node_id] = {
                        "errors": self.validated[node_id].errors,
                        "dependent_outputs": [],
                        "class_type": self.prompt[node_id]["class_type"],
                    }
                node_errors[node_id]["dependent_outputs"].append(output)
        return node_errors

    def _reachable(self, root: str) -> set[str]:
        seen = {root}
        pending = [root]
        while pending:
            for target in self.links.get(pending.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    pending.append(target)
        return seen

    def _walk(self, root: str) -> Generator[_Pending, _Outcome, None]:
        """Validate `root` and what it links to, depth-first on an explicit stack.

        A node's checks yield each linked node id and are sent back whether that
        node is valid; they yield a `_Pending` to have an awaitable awaited. An
        exception escaping a node's checks is thrown into the node that linked to
        it, which records it, or raised from here for `root`.
        """
        stack = [(root, self._check_node(root))]
        self._running.add(root)
        reply: Any = None
        failure: Exception | None = None
        while stack:
            node_id, checks = stack[-1]
            try:
                if failure is not None:
                    thrown, failure = failure, None
                    request = checks.throw(thrown)
                else:
                    request = checks.send(reply)
            except StopIteration:
                stack.pop()
                self._running.discard(node_id)
                reply = self.validated[node_id].ok
                continue
            except Exception as exc:
                stack.pop()
                self._running.discard(node_id)
                if not stack:
                    raise
                failure = exc
                continue
            if isinstance(request, _Pending):
                outcome = yield request
                reply, failure = outcome.value, outcome.error
                continue
            reply = None
            self.links.setdefault(node_id, []).append(request)
            known = self.validated.get(request)
            if known is not None:
                reply = known.ok
            elif request in self._running:
                failure = _CycleError(f"dependency cycle through node {request}")
            else:
                stack.append((request, self._check_node(request)))
                self._running.add(request)

    def _input_types(self, node: NodeDef) -> _ClassInputs:
        """INPUT_TYPES() once per class per prompt: some list files (LoadImage)."""
        cached = self._types.get(node.name)
        if cached is None:
            try:
                types = node.input_types()
                cached = _ClassInputs(types, types.declared())
            except Exception as exc:
                cached = (exc, exc.__traceback__)
            self._types[node.name] = cached
        if isinstance(cached, tuple):
            raise cached[0].with_traceback(cached[1])
        return cached

    def _check_node(self, node_id: str) -> _Checks:
        """ComfyUI's `validate_inputs` for one node, yielding each node it links to."""
        inputs: dict[str, Any] = self.prompt[node_id]["inputs"]
        node = _node_def(self.registry, self.prompt[node_id])
        class_inputs = self._input_types(node)
        types = class_inputs.types
        errors: list[ErrorDict] = []
        received: dict[str, Any] = {}
        valid = True
        for info in class_inputs.declared:
            if info.name not in inputs:
                if info.category == "required":
                    errors.append(
                        error(
                            "required_input_missing",
                            "Required input is missing",
                            info.name,
                            input_name=info.name,
                        )
                    )
                continue
            value = inputs[info.name]
            if not isinstance(value, list):
                problem = _check_constant(node, info, inputs)
            else:
                checked = self._check_link(node, info, value, received)
                if isinstance(checked, str):
                    try:
                        linked_ok = yield checked
                    except Exception as exc:
                        self.validated[checked] = _inner_exception(info, value, exc)
                        linked_ok = False
                    valid = valid and linked_ok is True
                    continue
                problem = checked
            if problem is not None:
                errors.append(problem)
        errors += yield from self._custom_validation(node_id, node, types, received)
        self.validated[node_id] = _NodeResult(valid and not errors, errors)

    def _check_link(
        self, node: NodeDef, info: InputInfo, link: list[Any], received: dict[str, Any]
    ) -> str | ErrorDict:
        """A linked input's shape and type: the linked node id, or an error.

        The lookups raise as ComfyUI's do (KeyError for a missing node, IndexError
        for a missing output) and the node that links here reports the exception.
        """
        if len(link) != 2:
            return error(
                "bad_linked_input",
                "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                info.name,
                input_name=info.name,
                input_config=info.config,
                received_value=link,
            )
        source_id, slot = link
        source = self.prompt[source_id]
        received_type = _node_def(self.registry, source).return_types[slot]
        received[info.name] = received_type
        if "input_types" not in node.validate_args and not types_compatible(
            received_type, info.type
        ):
            return error(
                "return_type_mismatch",
                "Return type mismatch between linked nodes",
                f"{info.name}, received_type({received_type}) mismatch input_type({info.type})",
                input_name=info.name,
                input_config=info.config,
                received_type=received_type,
                linked_node=link,
            )
        return str(source_id)

    def _custom_validation(
        self, node_id: str, node: NodeDef, types: InputTypes, received: dict[str, Any]
    ) -> Generator[_Pending, Any, list[ErrorDict]]:
        """Call VALIDATE_INPUTS; anything but True fails every input it was given."""
        if node.validate_fn is None:
            return []
        kwargs = self._validate_kwargs(node_id, node, types, received)
        result = node.validate_fn(**kwargs)
        if inspect.isawaitable(result):
            result = yield _Pending(result)
        if result is True or is_blocker(result):
            return []
        suffix = "" if result is False else f" - {result}"
        return [
            error(
                "custom_validation_failed",
                "Custom validation failed for node",
                f"{name}{suffix}",
                input_name=name,
            )
            for name in kwargs
        ]

    def _validate_kwargs(
        self, node_id: str, node: NodeDef, types: InputTypes, received: dict[str, Any]
    ) -> dict[str, Any]:
        """VALIDATE_INPUTS' arguments as ComfyUI builds them: declared constants in
        prompt order, links as None (nothing has run yet), then hidden values."""
        data: dict[str, Any] = {}
        for name, value in self.prompt[node_id]["inputs"].items():
            info = types.get(name)
            if is_link(value) and not (info is not None and info.options.get("rawLink")):
                data[name] = None
            elif info is not None:
                data[name] = value
        for info in types.hidden():
            if info.type == "UNIQUE_ID":
                data[info.name] = node_id
            elif isinstance(info.type, str) and info.type in _HIDDEN_AT_VALIDATION:
                data[info.name] = _copy_json(_HIDDEN_AT_VALIDATION[info.type])
        kwargs = {
            name: value
            for name, value in data.items()
            if node.validate_has_kwargs or name in node.validate_args
        }
        if "input_types" in node.validate_args:
            kwargs["input_types"] = received
        if node.input_is_list:
            # ComfyUI maps the call over lists; one prompt gives one-item lists.
            kwargs = {name: [value] for name, value in kwargs.items()}
        return kwargs
