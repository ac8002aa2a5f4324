"""Random bodies and query strings for every route in docs/openapi.json.

Never a 5xx (the json_errors middleware's 500 included), never a hang, JSON replies
are strict JSON, and the server keeps serving. Path parameters, query parameters and
bodies are drawn from the operation's description (names and types) mixed with noise.
"""

from __future__ import annotations

import json
import zlib
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import WSCloseCode
from hypothesis import example, given
from hypothesis import strategies as st

from comfyfleet.server.comfyui_api.ws import MAX_WS_MESSAGE
from tests.fuzz.harness import TIMEOUT_MARK_SECONDS, WS_LOST, LiveServer, Reply, fuzz_settings
from tests.fuzz.strategies import Big, Deep, json_values, numbers, text, to_json
from tests.integration.server.test_openapi import documented_operations, load_spec

pytestmark = [
    pytest.mark.timeout(TIMEOUT_MARK_SECONDS),
    # aiohttp *warns* about an unreadable Content-Disposition and skips the part; the suite's
    # filterwarnings=error would turn that warning into an exception inside the server.
    pytest.mark.filterwarnings("ignore::aiohttp.multipart.BadContentDispositionHeader"),
]

SPEC = load_spec()
OPERATIONS = sorted(
    (method, path, op)
    for (method, path), op in documented_operations(SPEC).items()
    if path not in ("/ws", "/api/ws")  # a GET upgrade: fuzzed as plain GETs below
)
OPERATIONS_BY_KEY = {(m, p): op for m, p, op in OPERATIONS}
#: Backends the fuzzer may create: unreachable loopback ports, so nothing is contacted.
BACKEND_NAMES = ["fz-a", "fz-b"]
BACKEND_URLS = ["http://127.0.0.1:9", "http://127.0.0.1:1/x"]


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SPEC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def from_schema(schema: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values shaped like `schema`, or (often) not: the server must refuse those cleanly."""
    schema = _resolve(schema)
    noise = json_values
    if depth > 3:
        return noise
    if "oneOf" in schema:
        return st.one_of([from_schema(s, depth + 1) for s in schema["oneOf"]])
    if "allOf" in schema:
        return from_schema(schema["allOf"][-1], depth + 1)
    if "enum" in schema:
        shaped: st.SearchStrategy[Any] = st.sampled_from(schema["enum"])
    else:
        kind = schema.get("type")
        kind = kind[0] if isinstance(kind, list) else kind
        if kind == "object" and "properties" in schema:
            props = {k: from_schema(v, depth + 1) for k, v in schema["properties"].items()}
            shaped = st.fixed_dictionaries({}, optional=props)
        elif kind == "object":
            shaped = st.dictionaries(text, json_values, max_size=4)
        elif kind == "array":
            shaped = st.lists(from_schema(schema.get("items", {}), depth + 1), max_size=4)
        elif kind == "integer":
            shaped = st.one_of(st.integers(-5, 5), numbers)
        elif kind == "number":
            shaped = numbers
        elif kind == "boolean":
            shaped = st.booleans()
        elif kind == "string":
            shaped = text
        else:
            shaped = noise
    return st.one_of(shaped, shaped, shaped, noise)


def query_value(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    schema = _resolve(schema)
    shaped: st.SearchStrategy[str]
    if "enum" in schema:
        shaped = st.sampled_from([str(v) for v in schema["enum"]])
    elif schema.get("type") in ("integer", "number"):
        shaped = st.one_of(
            st.sampled_from(HOSTILE_NUMBERS),
            st.integers(-5, 100).map(str),
            numbers.map(lambda n: json.dumps(n) if isinstance(n, int) else repr(n)),
        )
    else:
        shaped = st.one_of(text, st.sampled_from(["a.png", "b.png", "webp;50", "jpeg;9" * 3]))
    return st.one_of(shaped, shaped, text, st.sampled_from(HOSTILE_NUMBERS))


#: Query numbers past 64-bit and float limits, and the non-numbers float() reads.
HOSTILE_NUMBERS = [
    "",
    "-1",
    "0",
    "1.5",
    "nan",
    "-inf",
    "1e999",
    "9" * 30,
    "-" + "9" * 30,
    "9" * 5000,
    str(2**63),
    str(-(2**63) - 1),
    " 7 ",
    "0x10",
    "1_000",
    "\u0661",  # an Arabic-Indic digit: int() reads it
]


def path_value(name: str) -> st.SearchStrategy[str]:
    known = {"name": BACKEND_NAMES, "folder": ["checkpoints", "loras"], "node_class": ["Sleep"]}
    return st.one_of(st.sampled_from(known.get(name, ["x"])), text)


# ---------------------------------------------------------------- bodies


def _png(width: int, height: int) -> bytes:
    """A tiny valid RGBA PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return len(data).to_bytes(4, "big") + kind + data + crc.to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 6, 0, 0, 0])
    rows = b"".join(b"\x00" + b"\x80" * (4 * width) for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG = _png(2, 2)


BOUNDARY = "fuzz-boundary-7d1c"


def _part(name: str, value: bytes, filename: str | None, ctype: str | None) -> bytes:
    """One form part, written by hand: filenames may hold what aiohttp's client refuses."""
    disposition = f'form-data; name="{name}"'
    if filename is not None:
        disposition += f'; filename="{filename}"'
    head = f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n"
    if ctype is not None:
        head += f"Content-Type: {ctype}\r\n"
    return head.encode("utf-8", "surrogatepass") + b"\r\n" + value + b"\r\n"


@st.composite
def multipart(draw: st.DrawFn, schema: dict[str, Any]) -> bytes:
    body = b""
    fields = [*schema.get("properties", {}), "noise"]
    for name in draw(st.lists(st.sampled_from(fields), max_size=6)):
        if name in ("image", "noise") and draw(st.booleans()):
            content = draw(st.one_of(st.just(PNG), st.binary(max_size=300)))
            filename = draw(st.one_of(st.sampled_from(["a.png", "b.png", "", ".."]), text))
            ctype = draw(st.sampled_from(["image/png", "application/octet-stream", "text/x;x"]))
            body += _part(name, content, filename, ctype)
        elif name == "original_ref" and draw(st.booleans()):
            ref = draw(from_schema({"type": "object", "properties": _REF_PROPS}))
            body += _part(name, to_json(ref).encode(), None, None)
        else:
            prop = schema.get("properties", {}).get(name, {"type": "string"})
            value = draw(query_value(prop)).encode("utf-8", "surrogatepass")
            body += _part(name, value, None, draw(st.sampled_from([None, "text/plain"])))
    if draw(st.integers(0, 9)) > 0:  # sometimes the closing boundary is missing
        body += f"--{BOUNDARY}--\r\n".encode()
    return body


_REF_PROPS = {
    "filename": {"type": "string", "enum": ["a.png", "b.png", "../a.png", "/etc/passwd"]},
    "type": {"type": "string", "enum": ["input", "output", "temp", "x"]},
    "subfolder": {"type": "string"},
}


@st.composite
def request_for(
    draw: st.DrawFn, operation: tuple[str, str]
) -> tuple[str, str, dict[str, str], Any, dict[str, str]]:
    method, path = operation
    op = OPERATIONS_BY_KEY[operation]
    for name in {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}:
        value = quote(draw(path_value(name)), safe="", errors="surrogatepass")
        path = path.replace("{" + name + "}", value)
    params: dict[str, str] = {}
    for param in op.get("parameters", []):
        if param["in"] == "query" and draw(st.booleans()):
            params[param["name"]] = draw(query_value(param["schema"]))
    params.update(draw(st.dictionaries(text, text, max_size=2)))
    headers: dict[str, str] = {}
    data: Any = None
    content = op.get("requestBody", {}).get("content", {})
    choice = draw(st.integers(0, 5))
    if "multipart/form-data" in content and choice < 4:
        data = draw(multipart(content["multipart/form-data"]["schema"]))
        headers["Content-Type"] = f"multipart/form-data; boundary={BOUNDARY}"
    elif choice < 3:
        schema = content.get("application/json", {}).get("schema", {})
        body = draw(from_schema(schema) if schema else json_values)
        if path.endswith("/fleet/backends") and isinstance(body, dict) and draw(st.booleans()):
            body["url"] = draw(st.sampled_from(BACKEND_URLS))
            body["name"] = draw(st.sampled_from(BACKEND_NAMES))
        data = to_json(body).encode()
        headers["Content-Type"] = "application/json"
    elif choice == 3:
        data = draw(st.binary(max_size=300))
        headers["Content-Type"] = draw(
            st.sampled_from(
                ["application/json", "text/plain", "multipart/form-data; boundary=x", "a/b"]
            )
        )
    return method, path, params, data, headers


def check_reply(method: str, path: str, reply: Reply) -> None:
    assert reply.status < 500, (method, path, reply.status, reply.body[:500])
    if reply.content_type == "application/json" and reply.body:
        reply.json()  # strict JSON: an error text that claims JSON must be JSON


@pytest.fixture(scope="module", autouse=True)
def images(live: LiveServer) -> None:
    """a.png and b.png in the input folder, so /view and /upload/mask reach real images."""
    for name in ("a.png", "b.png"):
        form = _part("image", PNG, name, "image/png") + f"--{BOUNDARY}--\r\n".encode()
        headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
        assert live.request("POST", "/upload/image", data=form, headers=headers).status == 200


@pytest.mark.parametrize(
    "operation", [(m, p) for m, p, _ in OPERATIONS], ids=[f"{m} {p}" for m, p, _ in OPERATIONS]
)
@fuzz_settings(12)
@given(data=st.data())
def test_every_route(live: LiveServer, operation: tuple[str, str], data: st.DataObject) -> None:
    method, path, params, body, headers = data.draw(request_for(operation))
    check_reply(method, path, live.request(method, path, params=params, data=body, headers=headers))


@fuzz_settings(30)
@given(params=st.dictionaries(st.sampled_from(["clientId", "x"]), text, max_size=2))
def test_ws_without_upgrade(live: LiveServer, params: dict[str, str]) -> None:
    for path in ("/ws", "/api/ws"):
        check_reply("GET", path, live.request("GET", path, params=params))


#: First WebSocket messages: text, JSON, feature_flags of any shape and size.
ws_messages = st.one_of(
    text,
    json_values,
    st.fixed_dictionaries({"type": st.just("feature_flags")}, optional={"data": json_values}),
    st.builds(Big, st.sampled_from([70_000, 1 << 20])).map(
        lambda big: {"type": "feature_flags", "data": {"supports_preview_metadata": big}}
    ),
)


@fuzz_settings(30)
@given(value=ws_messages, verbatim=st.booleans(), as_text=st.booleans())
# Always tried: a message far past any client's (it stalled every client while parsed),
# and nesting past the parser's recursion within the cap (it closed the socket, logging a
# traceback).
@example(value={"type": "feature_flags", "data": Big(1 << 20)}, verbatim=False, as_text=True)
@example(value=Deep(30_000), verbatim=False, as_text=True)
def test_ws_first_message(live: LiveServer, value: Any, verbatim: bool, as_text: bool) -> None:
    """Whatever a client's first message holds, its socket stays open (closed 1009 when past
    the cap, 1007 when a text frame is not UTF-8), and nothing is logged as an error."""
    message = value if verbatim and isinstance(value, str) else to_json(value)
    live.errors.take()
    closed = live.websocket(message, text=as_text)
    if len(message.encode("utf-8", "surrogatepass")) > MAX_WS_MESSAGE:
        # Refused from its header: the server may close before the client has sent it all.
        assert closed in (WSCloseCode.MESSAGE_TOO_BIG, WS_LOST), closed
    elif as_text and any(0xD800 <= ord(c) <= 0xDFFF for c in message):
        assert closed == WSCloseCode.INVALID_TEXT, closed
    else:
        assert closed is None, closed
    assert live.errors.take() == []


def test_server_still_serves(live: LiveServer) -> None:
    live.quiesce()
    for name in BACKEND_NAMES:  # backends the fuzzer added go, without waiting
        live.request("DELETE", f"/api/fleet/backends/{name}", params={"timeout": "0"})
    live.assert_serving()
    assert live.request("GET", "/api/fleet/backends").json() == {"backends": []}


def test_upload_named_like_a_folder(live: LiveServer) -> None:
    """Found by the long fuzz: a file name that is an existing folder's gave a 500."""
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    end = f"--{BOUNDARY}--\r\n".encode()
    into_folder = _part("image", PNG, "a.png", "image/png") + _part("subfolder", b"dir", None, None)
    assert live.request("POST", "/upload/image", data=into_folder + end, headers=headers).ok
    as_file = _part("image", PNG, "dir", "image/png")
    reply = live.request("POST", "/upload/image", data=as_file + end, headers=headers)
    assert reply.status == 200 and reply.json()["name"] == "dir (1)", reply
    overwrite = as_file + _part("overwrite", b"true", None, None)
    assert (
        live.request("POST", "/upload/image", data=overwrite + end, headers=headers).status == 400
    )


def test_upload_names_the_filesystem_refuses(live: LiveServer) -> None:
    """Found by the long fuzz: a name past the filesystem's limit gave a 500."""
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    end = f"--{BOUNDARY}--\r\n".encode()
    for filename, subfolder in [("9" * 300, b""), ("a.png", b"x" * 300), ("c.png", b"a.png/x")]:
        form = _part("image", PNG, filename, "image/png") + _part(
            "subfolder", subfolder, None, None
        )
        reply = live.request("POST", "/upload/image", data=form + end, headers=headers)
        assert reply.status == 400, (filename, subfolder, reply)
