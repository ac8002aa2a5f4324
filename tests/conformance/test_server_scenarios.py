"""Replay the recorded ComfyUI 0.3.64 sessions against a real gateway, over HTTP and WebSocket.

Every request of a scenario is sent as recorded, with the recorded client ids, to an
in-process server on 127.0.0.1. Each response must have the recorded status, content type
and body (prompt ids, numbers and timestamps translated or left out). Each WebSocket
client must receive the recorded frames, `status` and binary frames included, in order;
repeated progress reports are folded (TestSleep reports every ~10 ms).

The gateway differs from ComfyUI on purpose in a few ways (docs/differences.md); each
difference is applied to the expectation by one small function below:

- `routed_to`: per-prompt events go to the prompt's own client only. ComfyUI broadcasts
  TEXT frames, and for a prompt without client_id broadcasts progress, progress_state,
  previews, TEXT and execution_interrupted; the gateway sends those to no one.
- `fifo_front`: prompts queued with `front` run first-in first-out (ComfyUI: LIFO).
- `dispatch_order`: GET /queue lists pending prompts in run order (ComfyUI: heap order).
- `scrub`: node instances live for one execution, so PreviewImage temp names restart
  their counter; the testing pack is built in, so `python_module` names its module;
  tracebacks show each server's own code.

And one that is not a difference but ComfyUI's own randomness: it runs a prompt's output
branches in string-set order, so `in_recorded_output_order` lists them as recorded.
"""

from __future__ import annotations

import io
import re
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.helpers import load_scenario
from tests.integration.gateway.wire import (
    Received,
    Served,
    Socket,
    save_prompt,
    serve,
    sleep_prompt,
)

TEMP_NAME = re.compile(r"ComfyUI_temp_[a-z]{5}_\d{5}_\.png")
LONG_SLEEP = 1.0  # a TestSleep at least this long is something the recording waited on


# -- normalising payloads ------------------------------------------------------------


def scrub(value: Any) -> Any:
    """A payload with its run-specific values replaced by what must hold of them."""
    if isinstance(value, str):
        return TEMP_NAME.sub("<temp png>", value)
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "timestamp":
            assert isinstance(item, int), item
            out[key] = "<ms>"
        elif key == "traceback":  # the frames are the server's own code
            assert item and all(isinstance(line, str) for line in item), item
            out[key] = "<traceback>"
        elif key == "current_inputs":  # values are reprs of tensors (ComfyUI) or arrays
            out[key] = {name: len(values) for name, values in item.items()}
        elif key == "current_outputs":  # ComfyUI lists its cache's keys, not the prompt's
            assert all(isinstance(node, str) for node in item), item
            out[key] = "<node ids>"
        elif key == "python_module":
            assert isinstance(item, str) and item, item
            out[key] = "<module>"
        else:
            out[key] = scrub(item)
    return out


def translate(value: Any, ids: dict[str, str]) -> Any:
    """Recorded prompt ids replaced by ours, wherever they appear (keys included)."""
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, list):
        return [translate(v, ids) for v in value]
    if isinstance(value, dict):
        return {translate(k, ids): translate(v, ids) for k, v in value.items()}
    return value


def recorded_frame(frame: dict[str, Any]) -> tuple[str, Any]:
    """A recorded frame as (type, data), binary frames as a comparable summary."""
    if not frame.get("binary"):
        return frame["type"], frame["data"]
    code, header = frame["event_code"], frame["header"]
    if code == 1:
        return "binary", {"code": 1, "image_type": header["image_type"], **frame["payload_image"]}
    if code == 4:
        return "binary", {"code": 4, "metadata": header["metadata"], **frame["payload_image"]}
    return "binary", {"code": code, "node_id": header["node_id"], "text": frame["text"]}


def received_frame(frame: Received) -> tuple[str, Any]:
    """One of our frames in the same form (binary frames decoded with protocol.frames)."""
    if frame.type != "binary":
        return frame.type, frame.data
    decoded = frame.data
    if decoded.event_code == 3:
        return "binary", {
            "code": 3,
            "node_id": decoded.header["node_id"],
            "text": decoded.payload.decode(),
        }
    image = Image.open(io.BytesIO(decoded.payload))
    shape = {
        "format": image.format,
        "width": image.width,
        "height": image.height,
        "mode": image.mode,
    }
    if decoded.event_code == 1:
        return "binary", {"code": 1, "image_type": decoded.header["image_type"], **shape}
    assert decoded.event_code == 4, decoded.event_code
    return "binary", {"code": 4, "metadata": decoded.header["metadata"], **shape}


def node_states(data: dict[str, Any]) -> dict[str, Any]:
    """progress_state without the values of running nodes (they depend on timing)."""
    nodes = {}
    for node_id, entry in data["nodes"].items():
        kept = dict(entry)
        if entry["state"] == "running":
            del kept["value"], kept["max"]
        nodes[node_id] = kept
    return {"prompt_id": data["prompt_id"], "nodes": nodes}


def normalize(frames: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Tokens to compare, in order, with repeated progress reports folded.

    A progress_state is kept when a node changed state; a `progress` when it belongs to
    the node being executed and is not a repeat of the last kept token (status frames
    in between do not count). Progress of an async node that runs on in the background
    while later nodes execute is left out: when it lands is a matter of timing.
    """
    tokens: list[tuple[str, Any]] = []
    last_states: Any = None
    last_kept: Any = None  # the last token other than status
    executing: Any = None
    for kind, data in frames:
        if kind == "progress_state":
            states = node_states(data)
            if states == last_states:
                continue
            last_states = states
            token: tuple[str, Any] = (kind, states)
        elif kind == "progress":
            assert 0 <= data["value"] <= data["max"], data
            token = (kind, {k: v for k, v in data.items() if k != "value"})
            if data["node"] != executing or token == last_kept:
                continue
        else:
            if kind == "executing":
                executing = data["node"]
            token = (kind, scrub(data))
        tokens.append(token)
        if kind != "status":
            last_kept = token
    return tokens


def history_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A history entry to compare: outputs_to_execute as a set (ComfyUI's order is random)."""
    number, prompt_id, prompt, extra, outputs = entry["prompt"]
    scrubbed: dict[str, Any] = scrub(
        {**entry, "prompt": [number, prompt_id, prompt, extra, sorted(outputs)]}
    )
    return scrubbed


# -- the replay ------------------------------------------------------------------------


def greeting(client_id: str) -> dict[str, Any]:
    return {
        "type": "status",
        "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": client_id},
    }


@dataclass
class Posted:
    """A prompt the recording submitted."""

    request: dict[str, Any]
    client_id: str | None
    index: int  # submission order within the scenario


@dataclass
class Replay:
    served: Served
    steps: list[dict[str, Any]]
    ids: dict[str, str] = field(default_factory=dict)  # recorded prompt id -> ours
    posted: dict[str, Posted] = field(default_factory=dict)  # by recorded prompt id
    sockets: dict[str, Socket] = field(default_factory=dict)  # by client id
    expected: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    reached: dict[int, int] = field(default_factory=dict)  # ws step -> expected token count
    finished: dict[str, Socket] = field(default_factory=dict)  # closed, frames kept
    replies: dict[int, Any] = field(default_factory=dict)  # http step -> our JSON body

    def __post_init__(self) -> None:
        for step in self.steps:
            if accepted_prompt(step):
                request = step["request_json"]
                self.posted[step["response_json"]["prompt_id"]] = Posted(
                    request, request.get("client_id"), len(self.posted)
                )
        self.base = counter_base(self.steps)

    # -- the expectation, with the gateway's documented differences applied

    def plan(self) -> None:
        """Each client's recorded frames as the gateway routes them, and for each ws step
        how many tokens its client has received by then. (Prompt ids are translated at
        comparison time, once every prompt has one.)"""
        current: str | None = None  # the prompt the last POST /prompt submitted
        for index, step in enumerate(self.steps):
            if accepted_prompt(step):
                current = step["response_json"]["prompt_id"]
            if step["kind"] != "ws":
                continue
            client = step["client_id"]
            stream = self.expected[client]
            if not stream and not is_greeting(step["frames"][:1], client):
                stream.append(greeting(client))  # connected before this scenario's first frame
            for frame in step["frames"]:
                if routed_to(frame, current, self.posted) in (client, "everyone"):
                    stream.append(frame)
            self.reached[index] = len(normalize([recorded_frame(f) for f in stream]))

    def expectation(self, client: str) -> list[tuple[str, Any]]:
        frame_ids = fifo_front(self.steps, self.posted, self.ids)
        frames = [recorded_frame(translate(f, frame_ids)) for f in self.expected[client]]
        return normalize(frames)

    # -- driving

    async def run(self) -> None:
        self.plan()
        connect_at, leave_at = self.schedule()
        for index, step in enumerate(self.steps):
            leaving = [c for c, at in leave_at.items() if at == index and c in self.sockets]
            if leaving:
                await self.finish(leaving)
            for client in connect_at.get(index, []):
                self.sockets[client] = await self.served.connect(client)
            if step["kind"] == "http":
                await self.http(index, step)
            elif step["kind"] == "ws_send":
                await self.sockets[step["client_id"]].send_json(step["message"])
            elif step["kind"] == "ws":
                await self.wait_tokens(step["client_id"], self.reached[index])
        await self.finish(list(self.sockets))

    def schedule(self) -> tuple[dict[int, list[str]], dict[str, int]]:
        """Connect each client before the first prompt whose frames it was recorded with
        (the earliest POST since the last ws step before its own first one); a client whose
        frames are over leaves when a later client joins (09 part 4 used new sockets)."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for index, step in enumerate(self.steps):
            if step["kind"] in ("ws", "ws_send"):
                first.setdefault(step["client_id"], index)
                last[step["client_id"]] = index
        connect_at: dict[int, list[str]] = defaultdict(list)
        for client, index in first.items():
            at, earlier = 0, index - 1
            while earlier >= 0 and self.steps[earlier]["kind"] == "ws":
                earlier -= 1  # other clients' frames for the same requests
            while earlier >= 0 and self.steps[earlier]["kind"] != "ws":
                step = self.steps[earlier]
                if step["kind"] == "http" and (step["method"], step["path"]) == ("POST", "/prompt"):
                    at = earlier
                earlier -= 1
            connect_at[at].append(client)
        leave_at = {
            client: min(at for at, joining in connect_at.items() if joining and at > end)
            for client, end in last.items()
            if any(at > end for at, joining in connect_at.items() if joining)
        }
        return connect_at, leave_at

    async def http(self, index: int, step: dict[str, Any]) -> None:
        body = translate(step.get("request_json"), self.ids)
        interrupting = body.get("prompt_id") if isinstance(body, dict) else None
        if step["path"] == "/interrupt" and interrupting in self.ids.values():
            await self.wait_running(str(interrupting), fresh=True)  # still running, reporting
        if accepted_prompt(step):
            recorded_id = step["response_json"]["prompt_id"]
            body = in_recorded_output_order(body, recorded_id, self.steps, self.is_output)
        path = step["path"]
        for recorded, ours in self.ids.items():
            path = path.replace(recorded, ours)
        reply = await self.served.request(step["method"], path, body)
        where = f"step {index}: {step['method']} {step['path']}"
        assert reply.status == step["status"], (where, reply.text)
        assert reply.content_type == step["response_content_type"], where
        if "response_text" in step:
            assert reply.text == step["response_text"], where
            return
        expected = step["response_json"]
        self.replies[index] = reply.json
        if accepted_prompt(step):
            await self.accepted(index, expected, reply.json)
        elif step["path"] == "/queue":
            assert reply.json == self.expected_queue(expected), where
        elif step["path"].startswith("/history/"):
            entries = {k: history_entry(v) for k, v in reply.json.items()}
            assert entries == {self.ids[k]: self.entry(k, v) for k, v in expected.items()}, where
        else:
            assert scrub(reply.json) == scrub(translate(expected, self.ids)), where

    async def accepted(self, index: int, expected: dict[str, Any], ours: dict[str, Any]) -> None:
        recorded_id = expected["prompt_id"]
        posted = self.posted[recorded_id]
        self.ids[recorded_id] = ours["prompt_id"]
        uuid.UUID(ours["prompt_id"])
        assert ours == {
            "prompt_id": ours["prompt_id"],
            "number": self.number(expected["number"], posted.request),
            "node_errors": expected["node_errors"],
        }
        if sleep_seconds(posted.request) >= LONG_SLEEP and not self.next_is_ws(index):
            await self.wait_running(ours["prompt_id"], fresh=False)  # "observed running"

    def is_output(self, class_type: str) -> bool:
        node = self.served.gateway.engine.registry.get(class_type)
        return node is not None and node.is_output

    def next_is_ws(self, index: int) -> bool:
        later = [s for s in self.steps[index + 1 :] if s["kind"] != "note"]
        return bool(later) and later[0]["kind"] == "ws"

    async def wait_running(self, prompt_id: str, *, fresh: bool) -> None:
        """Until the prompt's TestSleep reports progress (after now, if `fresh`)."""
        recorded = next(r for r, ours in self.ids.items() if ours == prompt_id)
        posted = self.posted[recorded]
        if posted.client_id is None:  # no frames to watch: the jobs API says it runs
            await self.served.wait_job(prompt_id, "in_progress")
            return
        sock = self.sockets[posted.client_id]
        node = next(
            n for n, v in posted.request["prompt"].items() if v["class_type"] == "TestSleep"
        )
        await sock.progress(prompt_id, node, after=len(sock.frames) if fresh else 0)

    def number(self, recorded: float, request: dict[str, Any]) -> float:
        """Our number for a recorded one: explicit numbers as sent, else our counter."""
        if "number" in request:
            return float(request["number"])
        counter = abs(recorded) - self.base
        return -counter if request.get("front") else counter

    def entry(self, recorded_id: str, entry: dict[str, Any]) -> dict[str, Any]:
        ours = translate(entry, self.ids)
        ours["prompt"][0] = self.number(entry["prompt"][0], self.posted[recorded_id].request)
        return history_entry(ours)

    def expected_queue(self, recorded: dict[str, Any]) -> dict[str, Any]:
        def item(entry: list[Any]) -> list[Any]:
            ours: list[Any] = translate(entry, self.ids)
            ours[0] = self.number(entry[0], self.posted[entry[1]].request)
            return ours

        pending = dispatch_order(recorded["queue_pending"], self.posted)
        return {
            "queue_running": [item(e) for e in recorded["queue_running"]],
            "queue_pending": [item(e) for e in pending],
        }

    # -- comparing the streams

    async def wait_tokens(self, client: str, count: int) -> None:
        sock = self.sockets[client]
        await sock.wait_until(
            lambda frames: len(normalize([received_frame(f) for f in frames])) >= count,
            what=f"{count} frames as recorded",
        )

    async def finish(self, clients: list[str]) -> None:
        """Compare the clients' streams, then close them.

        A barrier prompt from a new client comes last: afterwards each stream must hold
        exactly the recorded frames, then nothing but the barrier's status frames.
        """
        expected = {c: self.expectation(c) for c in clients}
        for client in clients:
            await self.wait_tokens(client, len(expected[client]))
        marks = {c: len(self.sockets[c].frames) for c in clients}
        barrier = await self.served.connect()
        prompt = {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 1, "height": 1, "batch_size": 1, "color": 0xBA44},
            },
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        }
        # An explicit number: the barrier must not advance the counter the recording uses.
        pid = await self.served.submit(prompt, client_id=barrier.client_id, number=10**9)
        await barrier.done(pid)
        for client in clients:
            sock = self.finished[client] = self.sockets.pop(client)
            end = await sock.wait_for(
                lambda f: (
                    f.type == "status" and f.data["status"]["exec_info"]["queue_remaining"] == 0
                ),
                after=marks[client],
                what="the barrier's last status",
            )
            ours = normalize([received_frame(f) for f in sock.frames[: marks[client]]])
            assert ours == expected[client], first_difference(client, ours, expected[client])
            extra = [f.describe() for f in sock.frames[marks[client] : end + 1]]
            assert all(kind.startswith("status:") for kind in extra), (client, extra)
            await sock.close()
        await barrier.close()
        self.served.sockets.remove(barrier)


def first_difference(client: str, ours: list[Any], expected: list[Any]) -> str:
    """Both token streams around where they part, one token a line."""
    at = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), None)
    at = min(len(ours), len(expected)) if at is None else at
    lines = [f"client {client}: streams differ at token {at} (ours | recorded):"]
    for i in range(max(0, at - 3), min(max(len(ours), len(expected)), at + 6)):
        mine = short(ours[i]) if i < len(ours) else "-"
        theirs = short(expected[i]) if i < len(expected) else "-"
        lines.append(f"{'>' if i == at else ' '} {i:3} {mine:60} | {theirs}")
    if at < min(len(ours), len(expected)):
        lines += [f"ours:     {ours[at]}", f"recorded: {expected[at]}"]
    return "\n".join(lines)


def short(token: tuple[str, Any]) -> str:
    kind, data = token
    if kind == "progress_state":
        return f"{kind} " + ",".join(f"{n}:{e['state'][0]}" for n, e in data["nodes"].items())
    if kind == "status":
        return f"status {data['status']['exec_info']['queue_remaining']}"
    if kind == "binary":
        return f"binary {data['code']}"
    if isinstance(data, dict) and "node" in data:
        return f"{kind} {data['node']}"
    return kind


def accepted_prompt(step: dict[str, Any]) -> bool:
    return bool(
        step["kind"] == "http"
        and (step["method"], step["path"], step["status"]) == ("POST", "/prompt", 200)
    )


def is_greeting(frames: list[dict[str, Any]], client: str) -> bool:
    return (
        bool(frames)
        and frames[0].get("type") == "status"
        and frames[0]["data"].get("sid") == client
    )


def counter_base(steps: list[dict[str, Any]]) -> int:
    """The recorded counter value at the scenario's start (ours starts at 0)."""
    advanced = 0
    for step in steps:
        if step["kind"] != "http" or step["path"] != "/prompt" or step["method"] != "POST":
            continue
        request = step.get("request_json") or {}
        if "number" in request:
            continue
        if step["status"] == 200:
            return int(abs(step["response_json"]["number"])) - advanced
        advanced += 1
    return 0


def sleep_seconds(request: dict[str, Any]) -> float:
    nodes = request["prompt"].values()
    return max((n["inputs"]["seconds"] for n in nodes if n["class_type"] == "TestSleep"), default=0)


# -- the documented differences, applied to the expectation ------------------------------


def routed_to(frame: dict[str, Any], current: str | None, posted: dict[str, Posted]) -> str | None:
    """Who gets a recorded frame from the gateway: per-prompt events (JSON events naming
    a prompt, previews, TEXT) go to that prompt's client only, and nowhere without one."""
    if not frame.get("binary") and frame["type"] in ("status", "feature_flags"):
        return "everyone"
    if frame.get("binary"):
        prompt_id = frame["header"].get("metadata", {}).get("prompt_id", current)
    else:
        prompt_id = frame["data"]["prompt_id"]
    return posted[prompt_id].client_id if prompt_id in posted else None


def fifo_front(
    steps: list[dict[str, Any]], posted: dict[str, Posted], ids: dict[str, str]
) -> dict[str, str]:
    """Recorded frame ids -> ours, with front prompts run in submission order.

    The recording ran front prompts newest first; the gateway runs them oldest first.
    Their frame sequences are alike (same graph), so the k-th front prompt to run in the
    recording stands for the k-th front prompt submitted.
    """
    started = [
        f["data"]["prompt_id"]
        for step in steps
        if step["kind"] == "ws"
        for f in step["frames"]
        if f.get("type") == "execution_start"
    ]
    front = [p for p in posted if posted[p].request.get("front")]
    ran = [p for p in dict.fromkeys(started) if p in front]
    frame_ids = dict(ids)
    for recorded_ran, submitted in zip(ran, front, strict=True):
        if submitted in ids:
            frame_ids[recorded_ran] = ids[submitted]
    return frame_ids


def in_recorded_output_order(
    request: dict[str, Any],
    recorded_id: str,
    steps: list[dict[str, Any]],
    is_output: Callable[[str], bool],
) -> dict[str, Any]:
    """The request with its output nodes listed in the order the recording ran them.

    ComfyUI runs a prompt's output branches in the order of a string set (random per
    process); the gateway in the order the prompt lists them.
    """
    prompt = request["prompt"]
    outputs = [n for n, node in prompt.items() if is_output(node["class_type"])]
    ran = [
        f["data"]["node"]
        for step in steps
        if step["kind"] == "ws"
        for f in step["frames"]
        if f.get("type") == "executing"
        and f["data"]["prompt_id"] == recorded_id
        and f["data"]["node"] in outputs
    ]
    order = iter([*dict.fromkeys(ran), *(o for o in outputs if o not in ran)])
    keys = [next(order) if n in outputs else n for n in prompt]
    return {**request, "prompt": {n: prompt[n] for n in keys}}


def dispatch_order(items: list[list[Any]], posted: dict[str, Posted]) -> list[list[Any]]:
    """Pending queue items in the gateway's run order: front prompts first, in submission
    order; then by number; ties by submission order."""

    def key(item: list[Any]) -> tuple[int, float, int]:
        prompt = posted[item[1]]
        if prompt.request.get("front"):
            return 0, prompt.index, prompt.index
        return 1, float(item[0]), prompt.index

    return sorted(items, key=key)


# -- the tests -----------------------------------------------------------------------------

SCENARIOS = {
    "01-success": ["01-success"],
    "02-cached": ["01-success", "02-cached"],  # 02 posts 01's prompt again: all cached
    "03-preview-frames": ["03-preview-frames"],
    "04-validation-errors": ["04-validation-errors"],
    "05-runtime-error": ["05-runtime-error"],
    "06-interrupt": ["06-interrupt"],
}


async def replay(tmp_path: Path, *names: str) -> Replay:
    """Replay on a fresh server with one slot: one prompt at a time, as ComfyUI runs them."""
    steps = [step for name in names for step in load_scenario(name)["steps"]]
    async with serve(tmp_path, local_slots=1) as served:
        run = Replay(served, steps)
        await run.run()
        return run


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_scenario_replays_over_http_and_websocket(tmp_path: Path, scenario: str) -> None:
    await replay(tmp_path, *SCENARIOS[scenario])


async def test_07_queue_runs_front_prompts_first_in_first_out(tmp_path: Path) -> None:
    run = await replay(tmp_path, "07-queue")
    note = next(s for s in run.steps if "execution_order" in s)
    ours = {label: run.ids[recorded] for label, recorded in note["prompt_ids"].items()}
    assert note["execution_order"] == ["blocker", "C", "B", "E", "A", "D", "G"]  # LIFO front
    client = run.finished["aa7ec74347514471bec065b6f2d68151"]
    started = [f.data["prompt_id"] for f in client.frames if f.type == "execution_start"]
    assert started == [ours[label] for label in ["blocker", "B", "C", "E", "A", "D", "G"]]

    before, after = (
        run.replies[i]
        for i, s in enumerate(run.steps)
        if s.get("path") == "/queue" and s["method"] == "GET"
    )
    for body in (before, after):
        assert [item[1] for item in body["queue_running"]] == [ours["blocker"]]
        for item in body["queue_running"] + body["queue_pending"]:
            number, _, prompt, extra_data, outputs = item
            assert isinstance(number, int | float) and isinstance(prompt, dict)
            assert extra_data == {"client_id": client.client_id} and outputs == ["3"]
    pending = ["B", "C", "E", "A", "D", "F", "G"]
    assert [item[1] for item in before["queue_pending"]] == [ours[p] for p in pending]
    pending.remove("F")
    assert [item[1] for item in after["queue_pending"]] == [ours[p] for p in pending]

    async with serve(tmp_path, local_slots=1) as served:  # the same store, reopened
        assert await served.history_entry(ours["F"]) == {}
        assert (await served.job(ours["F"]))["status"] == "cancelled"
        assert (await served.job(ours["G"]))["number"] == 100.0


async def test_09_prompts_without_client_id_reach_no_socket(tmp_path: Path) -> None:
    run = await replay(tmp_path, "09-no-client-id")
    anonymous = {run.ids[r] for r, posted in run.posted.items() if posted.client_id is None}
    assert len(anonymous) == 3
    for client_id, sock in run.finished.items():
        named = [f.describe() for f in sock.frames if f.prompt_id in anonymous]
        assert named == [], client_id
        binary = [f.data.event_code for f in sock.frames if f.type == "binary"]
        owned = {run.ids[r] for r, posted in run.posted.items() if posted.client_id == client_id}
        # Only part 3 (posted by A) sends binary frames: a code-1 preview and one TEXT frame.
        assert binary == ([1, 3] if owned else []), client_id
        if not owned:  # B, and both clients of part 4, only ever get queue status
            assert {f.type for f in sock.frames} == {"status"}, client_id


async def test_08_history_pages_in_completion_order(tmp_path: Path) -> None:
    """Scenario 08's requests on a history whose completion order differs from submission."""
    steps = [s for s in load_scenario("08-history-api")["steps"] if s["kind"] == "http"]
    recorded_entry = next(iter(steps[0]["response_json"].values()))
    async with serve(tmp_path, local_slots=2) as served:
        sock = await served.connect()
        done = await served.run_in_turn(sock, (save_prompt(c, f"h{c}") for c in range(3)))
        slow = await served.submit(sleep_prompt(30, 50, node="TestSleep"), sock.client_id)
        await sock.progress(slow, "2")
        fast = await served.submit(save_prompt(3, "h3"), sock.client_id)
        await sock.done(fast)
        assert (await served.post("/interrupt", {"prompt_id": slow})).status == 200
        await sock.done(slow)
        order = [*done, fast, slow]  # the slow prompt was submitted before `fast`

        full = await served.get("/history")
        assert list(full) == order
        for entry in full.values():  # the recorded shape
            assert set(entry) == set(recorded_entry)
            assert set(entry["status"]) == set(recorded_entry["status"])
            assert len(entry["prompt"]) == 5
        assert full[slow]["status"]["status_str"] == "error"
        assert [m[0] for m in full[slow]["status"]["messages"]][-1] == "execution_interrupted"

        by_path = {
            "/history?max_items=2": order[-2:],  # the newest two, oldest first
            "/history?max_items=2&offset=1": order[1:3],  # offset counts from the oldest
            "/history?offset=3": order[3:],
            "/history?max_items=0": [],
        }
        for path, expected in by_path.items():
            reply = await served.request("GET", path)
            assert reply.content_type == steps[0]["response_content_type"], path
            assert list(reply.json) == expected, path

        unknown, delete, gone, delete_unknown, clear, empty = steps[2:]
        newest = order[-1]
        for step, method, path, body in (
            (unknown, "GET", unknown["path"], None),
            (delete, "POST", "/history", {"delete": [newest]}),
            (gone, "GET", f"/history/{newest}", None),
            (delete_unknown, "POST", "/history", delete_unknown["request_json"]),
            (clear, "POST", "/history", clear["request_json"]),
        ):
            reply = await served.request(method, path, body)
            assert (reply.status, reply.content_type) == (
                step["status"],
                step["response_content_type"],
            ), path
            if "response_text" in step:
                assert reply.text == step["response_text"] == "", path
            else:
                assert reply.json == step["response_json"] == {}, path
            if step is delete_unknown:  # only the deleted entry went
                assert list(await served.get("/history")) == order[:-1]
        reply = await served.request("GET", empty["path"])
        assert (reply.status, reply.json) == (empty["status"], empty["response_json"]) == (200, {})
        # The jobs stay: history is a view of finished jobs.
        assert (await served.job(order[0]))["status"] == "completed"
