"""What a ComfyUI backend can run, read from its `/object_info`.

A prompt can run on a backend when the backend has every `class_type` in it
and every constant value given to a combo input (checkpoint names, LoRAs, ...)
is among the values that backend offers. Combos of upload inputs
(`image_upload`) are left out: the gateway pushes those files first.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import weakref
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.children.graph import GATEWAY_ONLY_CLASSES
from comfyfleet.lanes.affinity import MODEL_SUFFIXES
from comfyfleet.protocol.prompt import is_link, unwrap_value

UPLOAD_FLAGS = ("image_upload", "video_upload", "audio_upload", "upload")


def _combo_options(spec: Any) -> list[Any] | None:
    if not isinstance(spec, list) or not spec:
        return None
    kind = spec[0]
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if any(options.get(flag) for flag in UPLOAD_FLAGS):
        return None
    if isinstance(kind, list):
        return kind
    if kind == "COMBO" and isinstance(options.get("options"), list):
        return list(options["options"])
    return None


@dataclass
class Capabilities:
    """One backend's node classes and the combo values each input accepts."""

    object_info: dict[str, Any] = field(default_factory=dict)
    models: dict[str, list[str]] = field(default_factory=dict)  # folder -> files
    _combos: dict[tuple[str, str], frozenset[Any]] = field(default_factory=dict, repr=False)
    _model_files: frozenset[str] = field(default_factory=frozenset, repr=False)
    _last: tuple[dict[str, Any], bool] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_object_info(
        cls, object_info: dict[str, Any], models: dict[str, list[str]] | None = None
    ) -> Capabilities:
        # A backend that is itself a gateway lists nodes that only run where the queue is.
        object_info = {k: v for k, v in object_info.items() if k not in GATEWAY_ONLY_CLASSES}
        combos: dict[tuple[str, str], frozenset[Any]] = {}
        for class_type, info in object_info.items():
            inputs = info.get("input", {}) if isinstance(info, dict) else {}
            for section in ("required", "optional"):
                for name, spec in (inputs.get(section) or {}).items():
                    options = _combo_options(spec)
                    if options is not None:
                        combos[(class_type, name)] = frozenset(_hashable(o) for o in options)
        models = models or {}
        files = frozenset(f for listed in models.values() for f in listed)
        return cls(object_info, models, combos, files)

    def missing_for(self, prompt: dict[str, Any]) -> list[str]:
        """Why this backend cannot run `prompt` (empty when it can)."""
        missing: list[str] = []
        for node_id, node in prompt.items():
            class_type = node.get("class_type")
            if class_type not in self.object_info:
                missing.append(f"node #{node_id}: class {class_type} is not installed")
                continue
            for name, value in (node.get("inputs") or {}).items():
                if is_link(value):
                    continue
                value = unwrap_value(value)
                allowed = self._combos.get((class_type, name))
                if allowed is not None:
                    if _hashable(value) not in allowed:
                        missing.append(f"node #{node_id}: {name} {value!r} is not available")
                elif self._lacks_model_file(value):
                    missing.append(f"node #{node_id}: model file {value!r} is not there")
        return missing

    def _lacks_model_file(self, value: Any) -> bool:
        """A free-text input naming a model file the backend's model folders do not hold."""
        return (
            bool(self.models)
            and isinstance(value, str)
            and value.lower().endswith(MODEL_SUFFIXES)
            and value not in self._model_files
        )

    def can_run(self, prompt: dict[str, Any]) -> bool:
        """Whether it has all `prompt` needs. The last answer is kept: lanes of backends
        with the same nodes share these capabilities, and a choice among a thousand of
        them asks each about the same prompt (a prompt is not changed once queued)."""
        last = self._last
        if last is not None and last[0] is prompt:
            return last[1]
        answer = not self.missing_for(prompt)
        self._last = (prompt, answer)
        return answer


def _hashable(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


class KnownCapabilities:
    """Capabilities by the bytes of the object_info they were read from (and the model
    files listed with it), shared by the lanes of one fleet: a thousand backends with
    the same nodes are parsed and indexed once, and kept in memory once."""

    def __init__(self) -> None:
        self._known: weakref.WeakValueDictionary[Key, Capabilities] = weakref.WeakValueDictionary()
        self._reading: dict[Key, asyncio.Future[Capabilities]] = {}

    @staticmethod
    def key(object_info: bytes, models: dict[str, list[str]]) -> Key:
        return hashlib.sha256(object_info).digest(), json.dumps(models, sort_keys=True)

    async def of(self, key: Key, object_info: bytes, models: dict[str, list[str]]) -> Capabilities:
        """The capabilities of this object_info: known, being read for another lane, or
        read now (in a worker thread: a real object_info is megabytes). ValueError when
        it is not a JSON object."""
        known = self._known.get(key)
        if known is not None:
            return known
        reading = self._reading.get(key)
        if reading is None:
            reading = self._reading[key] = asyncio.ensure_future(
                asyncio.to_thread(_read, object_info, models)
            )
            reading.add_done_callback(lambda _done: self._reading.pop(key, None))
        found = await asyncio.shield(reading)
        self._known[key] = found
        return found


Key = tuple[bytes, str]


def _read(object_info: bytes, models: dict[str, list[str]]) -> Capabilities:
    parsed = json.loads(object_info) if object_info.strip() else None
    if not isinstance(parsed, dict):
        raise ValueError("object_info is not a JSON object")
    return Capabilities.from_object_info(parsed, models)
