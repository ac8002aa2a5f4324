"""API keys: where they come from, and how a key typed into a workflow stays out of storage.

A key is named by reference: `env:NAME` (an environment variable), `secret:NAME`
(an entry of the secrets file named in the config), or typed into the workflow
as is, in the settings node or in any node whose output flows into its key
input through links. A typed key is swapped for a marker (`<redacted-key
0123abcd...>`) before the prompt is stored or run, in the prompt and anywhere in
its extra data (the UI workflow saved into PNGs); the marker flows along the
links in its place, and the key itself stays in this process's memory only. A
prompt run again after a restart finds the marker but no key, and fails saying
so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import os
import re
import secrets
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comfyfleet.domain.jobs import NewJob
from comfyfleet.engine.services import ServiceKey
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.prompt import is_link
from comfyfleet.provider_http.redact import Redactor

if TYPE_CHECKING:
    from comfyfleet.engine.executor import Engine
    from comfyfleet.engine.registry import NodeRegistry

log = logging.getLogger(__name__)

#: The engine service name of the vault.
SERVICE: ServiceKey[SecretVault] = ServiceKey("secrets")
#: Node classes list the inputs that hold key references here.
SECRET_INPUTS_ATTRIBUTE = "SECRET_INPUTS"

_MARKER = re.compile(r"^<redacted-key ([0-9a-f]{16})>$")
# Shorter typed values are not replaced inside other text: they would mangle it.
_MIN_REPLACED = 8

REFERENCE_HELP = (
    "env:NAME reads an environment variable, secret:NAME an entry of the secrets file; "
    "anything else is the key itself, kept in memory only (never stored); empty: no key"
)


class KeyUnavailable(ComfyfleetError, RuntimeError):
    """A key reference that cannot be resolved; the message says what to do."""


class SecretVault:
    def __init__(self, secrets_file: Path | None = None, env: Mapping[str, str] | None = None):
        self.secrets_file = secrets_file
        self._env = os.environ if env is None else env
        self._salt = secrets.token_bytes(16)
        self._typed: dict[str, str] = {}  # marker token -> key
        self._file: dict[str, str] | None = None
        self._known: set[str] = set()  # every secret value seen, for redaction

    # -- references -------------------------------------------------------------

    def remember(self, key: str) -> str:
        """Keep a typed key in memory; returns the marker that stands for it."""
        token = hmac.new(self._salt, key.encode(), hashlib.sha256).hexdigest()[:16]
        self._typed[token] = key
        self._known.add(key)
        return f"<redacted-key {token}>"

    def resolve(self, reference: str) -> str:
        """The key a reference names ("" for no key); raises KeyUnavailable."""
        kind, name = parse_reference(reference)
        if kind == "none":
            return ""
        if kind == "env":
            value = self._env.get(name)
            if not value:
                raise KeyUnavailable(f"the environment variable {name} is not set or empty")
        elif kind == "secret":
            value = self._from_file(name)
        elif kind == "memory":
            value = self._typed.get(name, "")
            if not value:
                raise KeyUnavailable(
                    "this prompt's API key was typed into the workflow, and such keys are "
                    "kept in memory only: the server has restarted since it was queued. "
                    "Queue the workflow again, or use env:NAME or secret:NAME"
                )
        else:
            value = name  # typed, and not scrubbed on the way in (a direct engine caller)
        self._known.add(value)
        return value

    def _from_file(self, name: str) -> str:
        if self.secrets_file is None:
            raise KeyUnavailable(
                f"secret:{name} needs a secrets file: name one with the COMFYFLEET_SECRETS_FILE "
                "environment variable (or secrets_file in the server's config)"
            )
        if self._file is None or name not in self._file:
            self._file = _read_secrets(self.secrets_file)  # re-read: it may have been edited
            self._known.update(self._file.values())
        value = self._file.get(name)
        if not value:
            raise KeyUnavailable(f"the secrets file has no entry {name!r}")
        return value

    def redactor(self) -> Redactor:
        """A redactor that knows every key this vault has seen."""
        return Redactor(self._known)

    # -- intake -----------------------------------------------------------------

    def scrub(
        self, prompt: dict[str, Any], extra_data: dict[str, Any], registry: NodeRegistry
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Copies of a prompt and its extra data with every typed key replaced by its marker
        (see typed_keys)."""
        replacements = {key: self.remember(key) for key in typed_keys(prompt, registry)}
        if not replacements:
            return prompt, extra_data
        replace = _replacer(replacements)
        return replace(prompt), replace(extra_data)

    def scrub_job(self, job: NewJob, registry: NodeRegistry) -> NewJob:
        prompt, extra_data = self.scrub(job.prompt, job.extra_data, registry)
        if prompt is job.prompt:
            return job
        return dataclasses.replace(job, prompt=prompt, extra_data=extra_data)


def scrub_new_job(engine: Engine, job: NewJob) -> NewJob:
    """`job` as it may be stored: typed keys swapped for markers (unchanged without a vault)."""
    vault = engine.services.get(SERVICE)
    if vault is None:
        return job
    return vault.scrub_job(job, engine.registry)


def parse_reference(reference: str) -> tuple[str, str]:
    """(kind, name): kind is none, env, secret, memory (a marker) or typed."""
    text = reference.strip()
    if not text:
        return "none", ""
    if marker := _MARKER.match(text):
        return "memory", marker.group(1)
    for prefix in ("env", "secret"):
        if text.startswith(prefix + ":") and len(text) > len(prefix) + 1:
            return prefix, text[len(prefix) + 1 :]
    return "typed", reference


def typed_keys(prompt: dict[str, Any], registry: NodeRegistry) -> set[str]:
    """The keys typed into a prompt, recognised by where they flow, not where they are typed.

    A key is a string literal of a secret input, or of any node whose output reaches
    a secret input through links, however many nodes it passes on the way (a String
    node, a pass-through, anything). Numbers and booleans upstream are left alone:
    a key is text, and redacting a number by value would mask that number wherever
    it appears. So are combo choices: they come from the server's own list, and a
    marker in their place would no longer be one of them.
    """
    nodes = {
        node_id: node
        for node_id, node in prompt.items()
        if isinstance(node, dict) and isinstance(node.get("inputs"), dict)
    }
    keys: set[str] = set()
    upstream: list[str] = []
    for node in nodes.values():
        for name in _secret_inputs(registry, node.get("class_type")):
            value = node["inputs"].get(name)
            if is_link(value):
                upstream.append(value[0])
            elif _is_typed(value):
                keys.add(value)
    seen: set[str] = set()
    while upstream:  # iterative: a chain of links may be longer than the stack is deep
        node_id = upstream.pop()
        if node_id in seen or node_id not in nodes:
            continue
        seen.add(node_id)
        inputs: dict[str, Any] = nodes[node_id]["inputs"]
        upstream.extend(value[0] for value in inputs.values() if is_link(value))
        typed = {name: value for name, value in inputs.items() if _is_typed(value)}
        if typed:
            choices = _choice_inputs(registry, nodes[node_id].get("class_type"))
            keys.update(value for name, value in typed.items() if name not in choices)
    return keys


def _is_typed(value: Any) -> bool:
    return isinstance(value, str) and parse_reference(value)[0] == "typed"


def _choice_inputs(registry: NodeRegistry, class_type: Any) -> set[str]:
    """The names of a node class's combo inputs (none known: every literal may be a key)."""
    node = registry.get(class_type) if isinstance(class_type, str) else None
    if node is None:
        return set()
    try:
        declared = node.input_types().declared()
    except Exception:  # a broken INPUT_TYPES: scrub rather than keep
        return set()
    return {info.name for info in declared if info.combo_options is not None}


def _secret_inputs(registry: NodeRegistry, class_type: Any) -> tuple[str, ...]:
    node = registry.get(class_type) if isinstance(class_type, str) else None
    names = getattr(node.cls, SECRET_INPUTS_ATTRIBUTE, ()) if node is not None else ()
    return tuple(names)


def _replacer(replacements: dict[str, str]) -> Callable[[Any], Any]:
    """Deep copy of JSON values with each key replaced, whole or inside longer text."""
    ordered = sorted(replacements.items(), key=lambda item: len(item[0]), reverse=True)

    def text(value: str) -> str:
        for key, marker in ordered:
            if value == key:
                return marker
            if len(key) >= _MIN_REPLACED and key in value:
                value = value.replace(key, marker)
        return value

    def walk(value: Any) -> Any:
        # Iterative: extra data comes from clients and may nest deeper than the stack.
        if not isinstance(value, dict | list):
            return text(value) if isinstance(value, str) else value
        top: Any = {} if isinstance(value, dict) else []
        pending: list[tuple[Any, Any]] = [(value, top)]
        while pending:
            source, target = pending.pop()
            pairs = source.items() if isinstance(source, dict) else enumerate(source)
            for key, item in pairs:
                if isinstance(item, dict | list):
                    copied: Any = {} if isinstance(item, dict) else []
                    pending.append((item, copied))
                    item = copied
                elif isinstance(item, str):
                    item = text(item)
                if isinstance(target, dict):
                    target[text(key) if isinstance(key, str) else key] = item
                else:
                    target.append(item)
        return top

    return walk


def _read_secrets(path: Path) -> dict[str, str]:
    """Top-level `name = "key"` entries of a TOML file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        # The parser's message may quote a line of the file: keep it out of the error.
        raise KeyUnavailable(f"cannot read the secrets file {path}: {type(exc).__name__}") from None
    return {name: value for name, value in data.items() if isinstance(value, str)}
