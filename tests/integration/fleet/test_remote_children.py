"""How "Run on the Fleet" inside a ComfyUI reaches its gateway (RemoteChildJobs), against
a real gateway process: a gateway killed and started again while a child runs is asked
again until it answers, and the child's result comes back; one gone for longer than the
grace fails the child with a clear reason."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from comfyfleet.children import remote
from comfyfleet.children.graph import ChildGraph, child_prompts, result_node
from comfyfleet.children.jobs import ChildFailed, ChildRequest
from comfyfleet.children.remote import RemoteChildJobs
from comfyfleet.imaging import decode
from tests.servers import ServerProcess, free_port

COLOR = 0x4080C0


def child(seconds: float) -> ChildRequest:
    graph = ChildGraph(
        {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": COLOR},
            },
            "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}},
        },
        ("2", 0),
    )
    return ChildRequest("parent-in-comfyui", "7", 0, child_prompts(graph, "7", 1, "seed")[0])


async def test_a_gateway_restarted_while_a_child_runs_is_asked_again(tmp_path: Path) -> None:
    port = free_port()
    gateway = ServerProcess(tmp_path / "gateway", "--local-slots", "1", port=port).start()
    jobs = RemoteChildJobs(gateway.url)
    try:
        prompt_id = await jobs.queue(child(1.0))
        waiting = asyncio.create_task(jobs.outcome(prompt_id))
        await asyncio.sleep(0.3)
        gateway.kill()  # mid-run: the restarted gateway runs it again
        await asyncio.sleep(1.5)  # out of reach meanwhile
        assert not waiting.done()
        await asyncio.to_thread(gateway.start)
        entry = await asyncio.wait_for(waiting, 60)
        (ref,) = entry["outputs"][result_node("7")]["images"]
        pixels = decode(await jobs.file(prompt_id, ref))[0]
        assert pixels.shape == (1, 8, 8, 3)
        assert await jobs.queue(child(1.0)) == prompt_id  # its key: the same child
    finally:
        await jobs.close()
        gateway.kill()


async def test_a_gateway_gone_longer_than_the_grace_fails_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "OUTAGE_GRACE", 1.0)
    jobs = RemoteChildJobs(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    started = time.monotonic()
    try:
        with pytest.raises(ChildFailed, match="did not answer for 1 s"):
            await jobs.queue(child(0.0))
    finally:
        await jobs.close()
    assert 1.0 <= time.monotonic() - started < 10
