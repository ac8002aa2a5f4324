"""Events relayed from backends reach the submitting client only, re-encoded for it."""

from __future__ import annotations

import asyncio
import io
import uuid
from typing import Any

import aiohttp
from PIL import Image

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import Fleet, sleep_prompt
from tests.integration.gateway.wire import Received, Socket

PER_CLIENT = 2


def streamed_prompt(color: int) -> dict[str, Any]:
    """EmptyImage -> Sleep(0.3) -> SaveImageWebsocket (a binary preview) + PreviewImage."""
    prompt = sleep_prompt(0.3, color)
    prompt["4"] = {"class_type": "SaveImageWebsocket", "inputs": {"images": ["2", 0]}}
    return prompt


async def connect(
    session: aiohttp.ClientSession, fleet: Fleet, *, preview_metadata: bool
) -> Socket:
    client_id = uuid.uuid4().hex
    ws = await session.ws_connect(f"ws://127.0.0.1:{fleet.gateway.port}/ws?clientId={client_id}")
    sock = Socket(ws, client_id)
    await sock.wait_for(lambda f: f.type == "status", what="the greeting")
    if preview_metadata:
        await sock.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
        await sock.wait_for(lambda f: f.type == "feature_flags", what="the feature_flags reply")
    return sock


def status_values(frames: list[Received]) -> list[int]:
    return [f.data["status"]["exec_info"]["queue_remaining"] for f in frames if f.type == "status"]


async def test_each_client_gets_only_its_own_prompts_frames(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=2)
    base = fleet.gateway.url
    async with aiohttp.ClientSession() as session:

        async def post_prompt(prompt: dict[str, Any], client_id: str) -> str:
            body = {"prompt": prompt, "client_id": client_id}
            async with session.post(f"{base}/prompt", json=body) as response:
                assert response.status == 200, await response.text()
                prompt_id: str = (await response.json())["prompt_id"]
                return prompt_id

        async def history_at_done(sock: Socket, prompt_id: str) -> dict[str, Any]:
            """The history entry, read the moment the done signal arrives."""
            await sock.done(prompt_id)
            async with session.get(f"{base}/history/{prompt_id}") as response:
                body: dict[str, dict[str, Any]] = await response.json()
            return body.get(prompt_id, {})

        alice = await connect(session, fleet, preview_metadata=True)
        bob = await connect(session, fleet, preview_metadata=False)
        owned: dict[str, list[str]] = {alice.client_id: [], bob.client_id: []}
        for color in range(PER_CLIENT):
            for sock in (alice, bob):
                owned[sock.client_id].append(
                    await post_prompt(streamed_prompt(color), sock.client_id)
                )

        entries = await asyncio.gather(
            *(history_at_done(sock, p) for sock in (alice, bob) for p in owned[sock.client_id])
        )
        assert [e.get("status", {}).get("status_str") for e in entries] == ["success"] * 4
        for sock in (alice, bob):
            await sock.wait_until(lambda frames: status_values(frames)[-1:] == [0], what="idle")
        lanes = {fleet.lane_of(p) for sock in (alice, bob) for p in owned[sock.client_id]}
        assert lanes == {"s0", "s1"}  # relayed from both backends

        for sock, code in ((alice, 4), (bob, 1)):
            mine = owned[sock.client_id]
            ids = {f.prompt_id for f in sock.frames if f.type != "binary"} - {None}
            assert ids == set(mine), (ids, mine)
            for prompt_id in mine:
                types = sock.json_types(prompt_id)
                assert types[0] == "execution_start", types
                for needed in ("execution_cached", "executing", "progress", "executed"):
                    assert needed in types, (needed, types)
                assert types[-2:] == ["execution_success", "executing"], types
                executed = [f.data for f in sock.of_prompt(prompt_id) if f.type == "executed"]
                assert [e["node"] for e in executed] == ["3"]
                assert executed[0]["output"]["images"][0]["type"] == "temp"

            # Binary previews: code 4 (with the prompt id) for alice, code 1 for bob.
            binary = [f.data for f in sock.frames if f.type == "binary"]
            assert [b.event_code for b in binary] == [code] * PER_CLIENT
            if code == 4:
                metas = [b.header["metadata"] for b in binary]
                assert sorted(m["prompt_id"] for m in metas) == sorted(mine)
                assert {m["node_id"] for m in metas} == {"4"}
            else:
                assert {b.header["image_type"] for b in binary} == {2}  # PNG
            for b in binary:
                assert Image.open(io.BytesIO(b.payload)).size == (8, 8)

            # Only the gateway's status frames: greeting with sid, then its own count, which
            # only falls once everything was queued (a backend's 0/1 would break that).
            statuses = [f.data for f in sock.frames if f.type == "status"]
            assert statuses[0]["sid"] == sock.client_id
            assert all("sid" not in s for s in statuses[1:])
            values = status_values(sock.frames)
            peak = values.index(max(values))
            assert max(values) <= 2 * PER_CLIENT
            after = values[peak:]
            assert after == sorted(after, reverse=True), values
            assert len(values) <= 1 + 4 * 2 * PER_CLIENT, values

        await alice.close()
        await bob.close()


async def test_one_backend_relays_each_prompts_frames_as_one_block(make_fleet: MakeFleet) -> None:
    """The next prompt goes to the backend as soon as it reports the last one's end, while
    the gateway still reads that one's history; a client still sees one prompt's done
    signal before the next prompt's first frame."""
    fleet = make_fleet(shared=1)
    async with aiohttp.ClientSession() as session:
        sock = await connect(session, fleet, preview_metadata=False)
        ids = [fleet.submit(sleep_prompt(0.05, color), sock.client_id) for color in range(8)]
        await sock.done(ids[-1])
        order = [f.prompt_id for f in sock.frames if f.type != "status" and f.prompt_id]
        blocks = [p for i, p in enumerate(order) if i == 0 or order[i - 1] != p]
        assert blocks == ids  # one contiguous block per prompt, in submission order
        for prompt_id in ids:
            assert sock.of_prompt(prompt_id)[-1].is_done(prompt_id)
        await sock.close()
