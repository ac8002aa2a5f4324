"""What comfy-api-proxy 0.1.6 reads from a ComfyUI when it cancels a running job, checked
against a real gateway with the answers a real ComfyUI 0.3.64 gave on that path
(tests/data/comfyui-reference/proxy-paths/cancel-running.json, recorded by
conformance/record_proxy_paths.py).

The proxy sends `POST /api/jobs/{id}/cancel`, then polls `GET /history/{id}` and
`GET /queue`: an entry whose messages hold `execution_interrupted` is `canceled`; no
entry and nothing in the queue is `expired`. ComfyUI 0.3.64 has no per-job cancel (405)
and stops a running prompt with `POST /interrupt {prompt_id}`; the gateway has both, and
either must leave the entry and the frames ComfyUI leaves for a prompt stopped mid-run.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REFERENCE
from tests.integration.gateway.wire import serve

RECORDED = REFERENCE / "proxy-paths" / "cancel-running.json"


def recorded() -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """The recorded job id, and its steps (http and ws) by position."""
    data: dict[str, Any] = json.loads(RECORDED.read_text("utf-8"))
    steps: list[dict[str, Any]] = data["steps"]
    submit = next(s for s in steps if s.get("path") == "/prompt")
    return submit["request_json"]["prompt_id"], submit, steps


def normal(value: Any, job: str) -> Any:
    """`value` with the job id named `<job>`, timestamps and queue numbers left out."""
    text = json.dumps(value).replace(job, "<job>")
    value = json.loads(text)
    if isinstance(value, list):
        return [normal(item, "<job>") for item in value]
    if not isinstance(value, dict):
        return value
    out = {k: "<ms>" if k == "timestamp" else normal(v, "<job>") for k, v in value.items()}
    if isinstance(out.get("prompt"), list):  # a history entry: [number, id, prompt, ...]
        out["prompt"] = ["<n>", *out["prompt"][1:]]
    return out


def after_stop(steps: list[dict[str, Any]]) -> tuple[list[Any], Any, Any]:
    """What ComfyUI sent and answered once the prompt was stopped: the frames, the
    /history/{id} answer, the /queue answer."""
    stop = next(i for i, s in enumerate(steps) if s.get("path") == "/interrupt")
    frames = next(s["frames"] for s in steps[stop:] if s["kind"] == "ws")
    history, queue = [s.get("response_json") for s in steps[stop:] if s["kind"] == "http"][-2:]
    return frames, history, queue


@pytest.mark.parametrize("stop", ["/api/jobs/{id}/cancel", "/interrupt"])
async def test_a_running_prompt_stopped_reads_as_comfyui_after_an_interrupt(
    tmp_path: Path, stop: str
) -> None:
    old, submit, steps = recorded()
    frames, history, queue = after_stop(steps)
    job = str(uuid.uuid4())  # as the proxy does: the job id is prompt_id and client_id
    body = json.loads(json.dumps(submit["request_json"]).replace(old, job))
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect(job, preview_metadata=True)
        reply = await served.post("/prompt", body)
        assert (reply.status, reply.json["prompt_id"]) == (200, job)
        await sock.progress(job, "2")
        # While it runs: no entry yet, and the queue lists it (the proxy's `running`).
        assert await served.get(f"/history/{job}") == {}
        assert [item[1] for item in (await served.get("/queue"))["queue_running"]] == [job]

        seen = len(sock.frames)
        if stop == "/interrupt":
            reply = await served.post("/interrupt", {"prompt_id": job})
        else:
            reply = await served.post(stop.format(id=job), None)
        assert reply.status == 200
        await sock.done(job)

        sent = [
            {"type": f.type, "data": f.data} for f in sock.frames[seen:] if isinstance(f.data, dict)
        ]
        ours = [f for f in sent if f["type"] != "progress" and "prompt_id" in f["data"]]
        theirs = [f for f in frames if "prompt_id" in f["data"]]
        assert normal(ours, job) == normal(theirs, old)
        entry = await served.get(f"/history/{job}")
        assert normal(entry, job) == normal(history, old)
        assert await served.get("/queue") == queue
