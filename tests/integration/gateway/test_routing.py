"""Routing under load: 50 clients, 500 prompts at once, each client sees its own prompts only."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.integration.gateway.wire import Socket, serve, sleep_prompt

CLIENTS = 50
PER_CLIENT = 10


def prompt_for(index: int) -> dict[str, object]:
    """EmptyImage(color=index) -> TestSleep(10-50 ms) -> PreviewImage or SaveImage."""
    output = "SaveImage" if index % 2 else "PreviewImage"
    seconds = 0.01 * (1 + index % 5)
    return sleep_prompt(seconds, index, node="TestSleep", output=output, prefix=f"route_{index}")


def assert_complete_run(sock: Socket, prompt_id: str) -> None:
    """execution_start first, executing null last, one success, and the output shown."""
    types = sock.json_types(prompt_id)
    assert types[0] == "execution_start", (sock.client_id, types)
    assert sock.of_prompt(prompt_id)[-1].is_done(prompt_id), (sock.client_id, types)
    assert types.count("execution_start") == types.count("execution_success") == 1, types
    assert types.count("executing") == 4, types  # nodes 1, 2, 3, then null
    executed = [f.data for f in sock.of_prompt(prompt_id) if f.type == "executed"]
    assert [e["node"] for e in executed] == ["3"], executed


async def test_each_of_fifty_clients_gets_exactly_its_own_prompts(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=16) as served:
        sockets = await asyncio.gather(*(served.connect(f"client-{c:02}") for c in range(CLIENTS)))

        async def submit(index: int) -> tuple[Socket, str]:
            sock = sockets[index % CLIENTS]
            return sock, await served.submit(prompt_for(index), sock.client_id)

        started = time.monotonic()
        submitted = await asyncio.gather(*(submit(i) for i in range(CLIENTS * PER_CLIENT)))
        await asyncio.gather(*(sock.done(prompt_id, timeout=60) for sock, prompt_id in submitted))
        # Status frames are coalesced under load, but the last one always has the final count.
        for sock in sockets:
            await sock.wait_until(
                lambda frames: (
                    [f for f in frames if f.type == "status"][-1].data["status"]
                    == {"exec_info": {"queue_remaining": 0}}
                ),
                what="a last status with queue_remaining 0",
            )
        elapsed = time.monotonic() - started

        owned: dict[str, set[str]] = {sock.client_id: set() for sock in sockets}
        for sock, prompt_id in submitted:
            owned[sock.client_id].add(prompt_id)
        for sock in sockets:
            named = {f.prompt_id for f in sock.frames} - {None}
            assert named == owned[sock.client_id], sock.client_id
            assert len(named) == PER_CLIENT
            for prompt_id in owned[sock.client_id]:
                assert_complete_run(sock, prompt_id)
            anonymous = {f.type for f in sock.frames if f.prompt_id is None}
            assert anonymous == {"status"}, (sock.client_id, anonymous)
            # The greeting; broadcasts: a burst of 10, then 20 a second; and one status
            # straight to the client before each of its done signals.
            statuses = sum(f.type == "status" for f in sock.frames)
            assert statuses <= 1 + (10 + 20 * elapsed) + PER_CLIENT, (statuses, elapsed)

        history = await served.get("/history")
        assert set(history) == {prompt_id for _, prompt_id in submitted}
        saved = sorted(p.name for p in served.gateway.folders.output.iterdir())
        assert len(saved) == CLIENTS * PER_CLIENT // 2
