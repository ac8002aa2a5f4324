"""A node class as ComfyUI defines it, read once: inputs, outputs, hooks."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

InputCategory = str  # "required" | "optional" | "hidden"


@dataclass(frozen=True)
class InputInfo:
    """One declared input: its type (a name or a combo list), category and options."""

    name: str
    type: Any
    category: InputCategory
    options: dict[str, Any]

    @property
    def config(self) -> list[Any]:
        """The `[type, options]` pair ComfyUI echoes back as `input_config`."""
        return [self.type, self.options]

    @property
    def is_lazy(self) -> bool:
        return bool(self.options.get("lazy", False))

    @property
    def combo_options(self) -> list[Any] | None:
        """The allowed values of a combo input (`[[...]]` or `["COMBO", {"options"}]`)."""
        if isinstance(self.type, list):
            return self.type
        if self.type == "COMBO" and isinstance(self.options.get("options"), list):
            return list(self.options["options"])
        return None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal answers (an answer whose comparison fails is taken as new)."""
    try:
        return bool(a == b)
    except Exception:
        return False


def _split_spec(spec: Any) -> tuple[Any, dict[str, Any]]:
    if isinstance(spec, tuple | list) and spec:
        options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
        return spec[0], options
    return spec, {}


@dataclass(frozen=True)
class InputTypes:
    """The result of one `INPUT_TYPES()` call, indexed by input name."""

    raw: dict[str, Any]
    by_name: dict[str, InputInfo] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> InputTypes:
        by_name: dict[str, InputInfo] = {}
        for category in ("required", "optional", "hidden"):
            for name, spec in (raw.get(category) or {}).items():
                if name in by_name:
                    continue
                type_, options = _split_spec(spec)
                by_name[name] = InputInfo(name, type_, category, options)
        return cls(raw=raw, by_name=by_name)

    def get(self, name: str) -> InputInfo | None:
        return self.by_name.get(name)

    def declared(self) -> list[InputInfo]:
        """Required then optional inputs, in declaration order."""
        return [i for i in self.by_name.values() if i.category != "hidden"]

    def hidden(self) -> list[InputInfo]:
        return [i for i in self.by_name.values() if i.category == "hidden"]


class NodeDef:
    """A registered node class with everything the engine asks of it."""

    def __init__(self, name: str, cls: type, *, display_name: str | None, python_module: str):
        self.name = name
        self.cls = cls
        self.display_name = display_name
        self.python_module = python_module
        self.function_name: str = getattr(cls, "FUNCTION", "")
        self.return_types: tuple[Any, ...] = tuple(getattr(cls, "RETURN_TYPES", ()))
        names = getattr(cls, "RETURN_NAMES", None)
        self.return_names: tuple[str, ...] = (
            tuple(names) if names else tuple(str(t) for t in self.return_types)
        )
        is_list = getattr(cls, "OUTPUT_IS_LIST", None)
        self.output_is_list: tuple[bool, ...] = (
            tuple(bool(x) for x in is_list) if is_list else (False,) * len(self.return_types)
        )
        self.is_output = getattr(cls, "OUTPUT_NODE", False) is True
        self.input_is_list = bool(getattr(cls, "INPUT_IS_LIST", False))
        self.category: str = getattr(cls, "CATEGORY", "sd")
        self.description: str = getattr(cls, "DESCRIPTION", "")
        self.not_idempotent = bool(getattr(cls, "NOT_IDEMPOTENT", False))
        function = getattr(cls, self.function_name, None)
        self.is_async = inspect.iscoroutinefunction(function)
        self.has_lazy_status = getattr(cls, "check_lazy_status", None) is not None
        self.is_changed: Callable[..., Any] | None = getattr(cls, "IS_CHANGED", None)
        self._parsed: InputTypes | None = None  # the last INPUT_TYPES() read
        hidden = self.input_types().raw.get("hidden") or {}
        self.wants_unique_id = "UNIQUE_ID" in hidden.values()
        self.validate_fn: Callable[..., Any] | None = getattr(cls, "VALIDATE_INPUTS", None)
        self.validate_args: tuple[str, ...] = ()
        self.validate_has_kwargs = False
        # A stand-in for a backend's node: its own code (unseen here) may lift min/max.
        self.ranges_checked_elsewhere = bool(getattr(cls, "RANGES_CHECKED_ELSEWHERE", False))
        if self.validate_fn is not None:
            spec = inspect.getfullargspec(self.validate_fn)
            self.validate_args = tuple(a for a in spec.args if a not in ("self", "cls", "s"))
            self.validate_has_kwargs = spec.varkw is not None

    def input_types(self) -> InputTypes:
        """Call `INPUT_TYPES()` now (it may list files, so its answer is not cached); an
        answer equal to the last one is not read again."""
        raw = getattr(self.cls, "INPUT_TYPES")()  # noqa: B009 - classes are duck-typed
        if not isinstance(raw, dict):
            raise TypeError(f"{self.name}.INPUT_TYPES() returned {type(raw).__name__}, not a dict")
        last = self._parsed
        if last is not None and _same(last.raw, raw):
            return last
        parsed = self._parsed = InputTypes.parse(raw)
        return parsed

    def object_info(self) -> dict[str, Any]:
        """This node in the shape of ComfyUI's `GET /object_info`."""
        raw = _jsonable(self.input_types().raw)
        inputs: dict[str, Any] = {}
        order: dict[str, list[str]] = {}
        for category in ("required", "optional", "hidden"):
            section = raw.get(category)
            if section:
                inputs[category] = section
                order[category] = list(section)
        info: dict[str, Any] = {
            "input": inputs,
            "input_order": order,
            "output": _jsonable(list(self.return_types)),
            "output_is_list": list(self.output_is_list),
            "output_name": list(self.return_names),
            "name": self.name,
            "display_name": self.display_name,
            "description": self.description,
            "python_module": self.python_module,
            "category": self.category,
            "output_node": self.is_output,
        }
        tooltips = getattr(self.cls, "OUTPUT_TOOLTIPS", None)
        if tooltips is not None:
            info["output_tooltips"] = list(tooltips)
        for flag in ("DEPRECATED", "EXPERIMENTAL", "API_NODE"):
            if hasattr(self.cls, flag):
                info[flag.lower()] = bool(getattr(self.cls, flag))
        return info


def _jsonable(value: Any) -> Any:
    """Tuples become lists, as the JSON wire would show them."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
