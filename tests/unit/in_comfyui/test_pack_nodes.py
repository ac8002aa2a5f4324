"""comfyfleet's fan-out nodes as ComfyUI runs them: one fan-out loop for the process,
a fresh event loop per prompt, ComfyUI's interrupt, and a journal that outlives a restart.

ComfyUI and torch are stand-ins (standin.py); the nodes, pools, journal (SQLite in the
user directory) and the provider emulator are real.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from comfyfleet.domain.budgets import ALLOWANCE_KEY as ALLOWANCE
from comfyfleet.fanout.mp4 import read_info
from comfyfleet.in_comfyui import key_scrubber, node_mappings, paid_route
from comfyfleet.in_comfyui.wrap import Bridge, exposed
from comfyfleet.nodes import build_registry
from comfyfleet.spend.holds import PAID_ROUTE
from tests.emulators import Emulator, start_emulator
from tests.unit.in_comfyui.standin import (
    Blocker,
    Interrupted,
    StandInComfyUI,
    Tensor,
    VideoFromFile,
)

KEY = "pack-test-key-0123456789"
COLLECT = "Concurrent Collect Images (30)"
SUBMIT = "Concurrent Submit | BFLFluxImage"
Call = Callable[..., Awaitable[Any]]


class Pack:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.standin = StandInComfyUI(root)
        self.classes: dict[str, type[Any]] = {}
        self.bridge: Bridge | None = None

    def start(self) -> None:
        (self.classes, _names), self.bridge = node_mappings(self.standin.comfy, build_registry())

    def stop(self) -> None:
        if self.bridge is not None:
            self.bridge.host.stop()
            self.bridge = None


@pytest.fixture
async def pack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pack]:
    monkeypatch.setenv("PACK_TEST_KEY", KEY)
    started = Pack(tmp_path)
    await asyncio.to_thread(started.start)
    yield started
    await asyncio.to_thread(started.stop)


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    found = await start_emulator(KEY, latency=0.3)
    yield found
    await found.server.close()


async def fan_out(pack: Pack, url: str, call: Call, seeds: range, mode: str) -> Any:
    (api,) = await call(
        "api",
        pack.classes["APISettings"],
        base_url=url,
        api_key="env:PACK_TEST_KEY",
        poll_interval=0.05,
    )
    tasks = {}
    for slot, seed in enumerate(seeds, 1):
        (tasks[f"task_{slot}"],) = await call(
            f"s{seed}",
            pack.classes[SUBMIT],
            prompt=f"variant {seed}",
            resolution="0.0625 MP",
            aspect_ratio="1:1",
            grounding=False,
            safety_tolerance=2,
            seed=seed,
            model="flux-2-pro",
            api_config=api,
        )
    return await call("collect", pack.classes[COLLECT], failure_mode=mode, **tasks)


async def test_a_batch_runs_in_comfyui_prompts_and_is_paid_once(
    pack: Pack, emulator: Emulator
) -> None:
    async def batch(call: Call) -> Any:
        return await fan_out(pack, emulator.url, call, range(3), "placeholder")

    collected = await pack.standin.run_prompt("p1", batch)
    images, status = collected["result"][:30], collected["result"][30]
    assert all(isinstance(image, Tensor) for image in images[:3])
    assert images[0].array.shape == (1, 256, 256, 3)
    assert all(isinstance(slot, Blocker) for slot in images[3:])  # not connected
    report = json.loads(status)
    assert report["counts"]["success"] == 3 and collected["ui"] == {"text": [status]}
    assert emulator.stats()["jobs"] == 3
    assert ("p1", "collect", 3.0, 3.0) in pack.standin.progress

    # Queued again: a new prompt in a new event loop, as ComfyUI runs each prompt.
    await pack.standin.run_prompt("p2", batch)
    assert emulator.stats()["jobs"] == 3

    # ComfyUI restarted on the same user directory: the journal pays for nothing again.
    await asyncio.to_thread(pack.stop)
    await asyncio.to_thread(pack.start)
    again = await pack.standin.run_prompt("p3", batch)
    assert json.loads(again["result"][30])["counts"]["success"] == 3
    assert emulator.stats()["jobs"] == 3
    assert (pack.root / "user" / "comfyfleet" / "fanout-journal.db").is_file()


async def test_videos_reach_comfyui_as_its_own_video_values(
    pack: Pack, emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PACK_WRONG_KEY", "not-the-key")
    video = {"model": "sora-2", "seconds": "4", "size": "1280x720"}

    async def videos(call: Call) -> Any:
        settings = pack.classes["APISettings"]
        (api,) = await call("api", settings, base_url=emulator.url, api_key="env:PACK_TEST_KEY")
        (wrong,) = await call("bad", settings, base_url=emulator.url, api_key="env:PACK_WRONG_KEY")
        submit = pack.classes["Concurrent Submit | OpenAIVideo"]
        (good,) = await call("s1", submit, prompt="a pond", seed=1, api_config=api, **video)
        (skipped,) = await call(
            "s2", submit, prompt="a pond", seed=2, api_config=wrong, skip_error=True, **video
        )
        collect = pack.classes["Concurrent Collect Videos (10)"]
        collected = await call("c", collect, failure_mode="fail_fast", task_1=good, task_2=skipped)
        serial = await call(
            "v", pack.classes["OpenAIVideo"], prompt="x", seed=3, api_config=api, **video
        )
        return collected, serial

    collected, (serial,) = await pack.standin.run_prompt("p1", videos)
    first, second = collected["result"][:2]
    assert all(isinstance(value, VideoFromFile) for value in (first, second, serial))
    sizes = [read_info(Path(v.file).read_bytes()) for v in (first, second, serial)]
    assert [(info.width, info.height) for info in sizes] == [(1280, 720), (512, 512), (1280, 720)]
    report = json.loads(collected["result"][10])
    assert report["counts"] == {"success": 1, "skipped_error": 1, "not_connected": 8}


async def test_comfyuis_interrupt_cancels_the_remote_jobs(pack: Pack, emulator: Emulator) -> None:
    emulator.settings.latency = 30.0

    async def batch(call: Call) -> Any:
        return await fan_out(pack, emulator.url, call, range(10, 14), "fail_fast")

    running = asyncio.create_task(pack.standin.run_prompt("p1", batch))
    async with asyncio.timeout(10):
        while emulator.stats()["jobs"] < 4:
            await asyncio.sleep(0.02)
    pack.standin.interrupt.set()  # POST /interrupt
    with pytest.raises(Interrupted):
        await asyncio.wait_for(running, 10)
    assert emulator.stats()["cancelled"] == 4
    assert emulator.stats()["downloads"] == 0


async def test_an_interrupt_between_nodes_cancels_them_though_the_next_prompt_starts(
    pack: Pack, emulator: Emulator
) -> None:
    emulator.settings.latency = 30.0

    async def submits_then_a_comfyui_node(call: Call) -> Any:
        settings = pack.classes["APISettings"]
        (api,) = await call("api", settings, base_url=emulator.url, api_key="env:PACK_TEST_KEY")
        for seed in range(20, 23):
            await call(
                f"s{seed}",
                pack.classes[SUBMIT],
                prompt="p",
                resolution="0.0625 MP",
                aspect_ratio="1:1",
                grounding=False,
                safety_tolerance=2,
                seed=seed,
                model="flux-2-pro",
                api_config=api,
            )
        pack.standin.interrupt.set()  # POST /interrupt while ComfyUI's own node runs,
        raise Interrupted()  # which ComfyUI stops at once

    async def nothing(call: Call) -> None:
        return None

    with pytest.raises(Interrupted):
        await pack.standin.run_prompt("p1", submits_then_a_comfyui_node)
    await pack.standin.run_prompt("p2", nothing)  # resets ComfyUI's flag at its start
    async with asyncio.timeout(10):
        while emulator.stats()["cancelled"] < 3:
            await asyncio.sleep(0.02)
    assert emulator.stats()["jobs"] == 3 and emulator.stats()["downloads"] == 0


async def test_the_classes_keep_inputs_outputs_and_checks(pack: Pack) -> None:
    settings = pack.classes["APISettings"]
    # ComfyUI reads VALIDATE_INPUTS's argument names to know which inputs it checks.
    assert inspect.getfullargspec(settings.VALIDATE_INPUTS).args == ["base_url"]
    assert settings.VALIDATE_INPUTS(base_url="ftp://x") != True  # noqa: E712
    assert settings.VALIDATE_INPUTS(base_url="http://x") is True
    submit = pack.classes[SUBMIT]
    assert submit.RETURN_TYPES == ("IMAGE_FUTURE",)
    assert inspect.iscoroutinefunction(getattr(submit, submit.FUNCTION))
    assert "api_config" in submit.INPUT_TYPES()["required"]
    # IS_CHANGED carries the fan-out service's failure epoch: a failure is never cached.
    assert pack.bridge is not None
    pack.bridge.service.failure_epoch += 1
    assert submit.IS_CHANGED(seed=1) == [1, 1]  # the original's, then the twin's
    assert pack.classes[COLLECT].OUTPUT_NODE is True


def test_only_comfyfleets_own_nodes_are_added() -> None:
    registry = build_registry()
    names = {node.name for node in exposed(registry, {"OpenAIImage"})}
    assert {"APISettings", "BFLFluxImage", COLLECT, SUBMIT} <= names
    # Its copies of ComfyUI's image nodes, their twins, and names ComfyUI has: left out.
    assert not names & {"ImageInvert", "SaveImage", "Concurrent Submit | ImageInvert"}
    assert not names & {"OpenAIImage", "Concurrent Submit | OpenAIImage"}


async def test_a_typed_key_never_reaches_comfyuis_queue(pack: Pack) -> None:
    assert pack.bridge is not None
    scrub = key_scrubber(pack.bridge.service.vault, build_registry())
    prompt = {
        "api": {"class_type": "APISettings", "inputs": {"base_url": "http://x", "api_key": KEY}},
        "ref": {
            "class_type": "APISettings",
            "inputs": {"base_url": "http://x", "api_key": "env:A"},
        },
    }
    extra = {"extra_pnginfo": {"workflow": {"nodes": [{"widgets_values": ["http://x", KEY]}]}}}
    body = {"prompt": prompt, "extra_data": extra, "client_id": "c"}
    scrubbed = scrub(body)
    assert KEY not in json.dumps(scrubbed)
    assert scrubbed["prompt"]["api"]["inputs"]["api_key"].startswith("<redacted-key ")
    assert scrubbed["prompt"]["ref"]["inputs"]["api_key"] == "env:A"
    assert scrubbed["client_id"] == "c"
    assert KEY in json.dumps(body)  # the caller's copy is left alone
    assert scrub({"no": "prompt"}) == {"no": "prompt"}


async def test_an_error_carrying_a_key_is_redacted(pack: Pack) -> None:
    assert pack.bridge is not None
    pack.bridge.service.vault.resolve("env:PACK_TEST_KEY")  # a key the vault has seen
    redacted = pack.bridge._redacted(ValueError(f"the provider said: {KEY} is wrong"))
    assert KEY not in str(redacted) and "ValueError" in str(redacted)


async def test_a_gateways_allowance_caps_the_prompts_paid_jobs_and_the_route_says_so(
    pack: Pack, emulator: Emulator
) -> None:
    assert pack.bridge is not None
    host = pack.bridge.host
    allowed = {"paid_jobs": 2, "spend": None, "prices": {"bfl": {"flux-2-pro": 0.5}}}
    host.allowances.note({"prompt": {}, "prompt_id": "p1", "extra_data": {ALLOWANCE: allowed}})

    async def batch(call: Call) -> Any:
        return await fan_out(pack, emulator.url, call, range(3), "placeholder")

    collected = await pack.standin.run_prompt("p1", batch)
    report = json.loads(collected["result"][30])
    assert report["counts"]["success"] == 2
    refused = [slot for slot in report["slots"] if slot.get("error_class") == "BudgetExceeded"]
    assert len(refused) == 1 and ALLOWANCE in refused[0]["error"]
    assert emulator.stats()["jobs"] == 2

    # What the gateway reads at the prompt's end, priced by the allowance's table.
    app = web.Application()
    app.router.add_get(PAID_ROUTE, paid_route(host))
    async with TestClient(TestServer(app)) as client:
        answer = await (await client.get("/comfyfleet/paid/p1")).json()
        assert answer == {"prompt_id": "p1", "paid_jobs": 2, "spend": 1.0}
        nothing = await (await client.get("/comfyfleet/paid/unknown")).json()
        assert nothing["paid_jobs"] == 0

    # An allowance that cannot be read lets nothing be paid; a prompt without an id
    # gets the one ComfyUI would make up, so its allowance can be found.
    bad = {"prompt": {}, "prompt_id": "p2", "extra_data": {ALLOWANCE: {"paid_jobs": "lots"}}}
    host.allowances.note(bad)

    async def other(call: Call) -> Any:
        return await fan_out(pack, emulator.url, call, range(10, 12), "placeholder")

    collected = await pack.standin.run_prompt("p2", other)
    assert "success" not in json.loads(collected["result"][30])["counts"]
    assert emulator.stats()["jobs"] == 2
    noted = host.allowances.note({"prompt": {}, "extra_data": {ALLOWANCE: {"paid_jobs": 1}}})
    assert isinstance(noted["prompt_id"], str)
    assert await host.allowances.terms_of(noted["prompt_id"]) is not None
