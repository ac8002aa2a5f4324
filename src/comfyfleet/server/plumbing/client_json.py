"""JSON from clients (request bodies, form fields, WebSocket messages), read once with bounds.

`json.loads` accepts two things no later step can handle. A lone UTF-16 surrogate
(`"\\ud800"`) is a valid JSON escape but not Unicode text: UTF-8 cannot encode it, so it
breaks the first SQLite query, file name or UTF-8 reply it reaches. Nesting is only bounded
by the interpreter's recursion limit, so a value that parses can still overflow whatever
walks it recursively afterwards (copying, encoding, validation). Both are refused here, for
every route, instead of being caught wherever they would break.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from comfyfleet.errors import ClientError
from comfyfleet.protocol.errors import error, prompt_error_body

#: Bodies larger than this are parsed in a worker thread: a 50 MB prompt takes most of a
#: second to read, which no other client should wait for.
OFF_LOOP_BYTES = 256 * 1024

#: Levels of arrays and objects a client's JSON may nest. A ComfyUI prompt needs about 5,
#: a workflow with nested subgraphs in extra_data a few dozen; recursive steps stay far
#: from Python's limit of 1,000 frames.
MAX_DEPTH = 100

_SURROGATE = re.compile("[\ud800-\udfff]")
# In JSON text decoded strictly, a surrogate can only come from an escape such as \ud800.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class RefusedJson(ClientError):
    """Client JSON that cannot be used: `message` and `details` say why, for the client."""

    type = "invalid_json"


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a UTF-16 surrogate code point (decoded JSON pairs them up, so
    any left is alone): such text is not Unicode and cannot be encoded as UTF-8."""
    return _first_surrogate(text) is not None


def _first_surrogate(text: str) -> str | None:
    found = None if text.isascii() else _SURROGATE.search(text)
    return None if found is None else found.group()


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """`raw` as JSON; RefusedJson unless it is well-formed Unicode text, nested at most
    `max_depth` levels deep and free of lone surrogates.

    Bytes are decoded strictly (UTF-8, or UTF-16/32 as `json.loads` detects them), so
    surrogates sent as raw bytes are refused as not JSON.
    """
    try:
        text = raw.decode(json.detect_encoding(raw)) if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise RefusedJson("Request body is not JSON", str(exc)) from None
    _refuse_surrogate(text)  # text a caller decoded leniently (e.g. by a form field's charset)
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as exc:  # also integers past Python's digit limit
        raise RefusedJson("Request body is not JSON", str(exc)) from None
    # Only escapes can add surrogates now: the strings need a look only if the text has some.
    _check(value, max_depth, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return value


def _refuse_surrogate(text: str) -> None:
    if (lone := _first_surrogate(text)) is not None:
        raise RefusedJson(
            "Request body holds a lone surrogate",
            f"\\u{ord(lone):04x} without its pair is not Unicode text",
        )


def _too_deep(max_depth: int) -> RefusedJson:
    return RefusedJson(
        "Request body is nested too deeply", f"more than {max_depth} levels of arrays and objects"
    )


def _check(value: Any, max_depth: int, *, strings: bool) -> None:
    """Walk `value` without recursion: containers for depth, and with `strings` every key
    and string for lone surrogates. (A top-level array or object is at depth 1.)"""
    if strings and isinstance(value, str):
        _refuse_surrogate(value)
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise _too_deep(max_depth)
        if isinstance(item, dict):
            if strings:
                for key in item:
                    _refuse_surrogate(key)
            item = item.values()
        for child in item:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif strings and kind is str:
                _refuse_surrogate(child)


async def read_json(request: web.Request, max_bytes: int | None = None) -> Any:
    """The request body as JSON (empty bodies read as {}), or ComfyUI's 400 `invalid_json`
    (`too_large`, unread when its Content-Length says so, past `max_bytes`).

    Every route that takes a JSON body reads it here.
    """
    if max_bytes is not None and (request.content_length or 0) > max_bytes:
        raise _too_large(max_bytes)
    raw = await request.read()
    if max_bytes is not None and len(raw) > max_bytes:
        raise _too_large(max_bytes)
    if not raw.strip():
        return {}
    try:
        if len(raw) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(loads, raw)
        return loads(raw)
    except RefusedJson as refused:
        raise bad_request(refused.type, refused.message, refused.details) from None


def bad_request(kind: str, message: str, details: str = "") -> web.HTTPBadRequest:
    """ComfyUI's 400, to raise."""
    return web.HTTPBadRequest(
        text=json.dumps(prompt_error_body(error(kind, message, details))),
        content_type="application/json",
    )


def _too_large(max_bytes: int) -> web.HTTPBadRequest:
    return bad_request(
        "too_large",
        "Request body is too large",
        f"larger than {max_bytes} bytes (max_prompt_bytes)",
    )
