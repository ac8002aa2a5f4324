"""Failure policies, skip_error, and interrupts: what is cancelled, what is reported."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np

from comfyfleet.engine.run import RunHandle
from comfyfleet.fanout import FanoutSettings, PoolSize
from tests.emulators import Emulator
from tests.helpers import Recorder
from tests.integration.fanout.conftest import KEY, WRONG_ENV, Graph, MakeRig, Rig, start_emulator
from tests.integration.fanout.test_concurrency import run, status_of


async def until(check: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def journal_states(rig: Rig) -> list[str]:
    rows = await asyncio.to_thread(_states, rig)
    return sorted(rows)


def _states(rig: Rig) -> list[str]:
    import sqlite3

    with sqlite3.connect(rig.store.path) as conn:
        return [state for (state,) in conn.execute("SELECT state FROM remote_jobs")]


async def test_fail_fast_cancels_queued_and_running_jobs(
    make_rig: MakeRig, emulator: Emulator
) -> None:
    rig = await make_rig(FanoutSettings(image=PoolSize(3, 30)))
    emulator.settings.latency = 5.0
    failing = await start_emulator(latency=0.5, error_rate=1.0, keys=[])  # jobs end in Error
    try:
        graph = Graph(emulator.url)
        bad_api = graph.api(failing.url, f"env:{WRONG_ENV}")
        # The good submits wait a moment (their prompt comes through a Sleep), so the bad
        # one holds a pool slot first and the good ones are running or queued when it fails.
        graph.prompt["late"] = {
            "class_type": "Sleep",
            "inputs": {"value": "a fox", "seconds": 0.2},
        }
        bad = graph.submit("bad", "doomed", seed=0, settings=bad_api)
        good = [graph.submit(f"g{n}", ["late", 0], seed=n) for n in range(6)]
        graph.collect("c", [bad, *good])
        started = time.monotonic()
        result = await run(rig, graph.prompt)
        assert time.monotonic() - started < 3.0
    finally:
        await failing.server.close()
    assert result.status == "error"
    assert result.error is not None
    assert result.error["exception_type"] == "comfyfleet.fanout.collect.CollectFailed"
    assert result.error["exception_message"].startswith("slot 1 failed: JobFailed")
    # Two good jobs were running and were cancelled at the provider; the one that took the
    # bad job's slot may have been sent in between (then it was cancelled there too); the
    # rest never left. Whatever was journaled is final.
    stats = emulator.stats()
    assert stats["jobs"] in (2, 3)
    assert stats["jobs"] == stats["cancels"] == stats["cancelled"]
    states = await journal_states(rig)
    assert states.count("failed") == 1 and len(states) in (3, 4)
    assert set(states) == {"cancelled", "failed"}


async def test_placeholder_mode_completes_with_red_slots_and_an_exact_status(
    rig: Rig, emulator: Emulator
) -> None:
    graph = Graph(emulator.url)
    wrong = graph.api(emulator.url, f"env:{WRONG_ENV}")  # the emulator refuses this key
    slots = [
        graph.submit("ok1", "fine", seed=1),
        graph.submit("bad", "refused", seed=2, settings=wrong),
        graph.submit("skip", "refused", seed=3, settings=wrong, skip_error=True),
        graph.submit("ok2", "fine", seed=4),
    ]
    graph.collect("c", slots, mode="placeholder")
    for n in range(1, 5):
        graph.save(f"save{n}", "c", n - 1, prefix=f"slot{n}")
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    report = status_of(result, "c")
    assert report["failure_mode"] == "placeholder"
    assert report["counts"] == {"success": 2, "failed": 1, "skipped_error": 1, "not_connected": 26}
    entries = report["slots"]
    assert [e["state"] for e in entries[:4]] == ["success", "failed", "skipped_error", "success"]
    failed = entries[1]
    assert (failed["error_class"], failed["http_status"], failed["provider"]) == (
        "ProviderError",
        403,
        "bfl",
    )
    assert "invalid API key" in failed["error"] and failed["remote_id"] is None
    assert failed["endpoint"] == f"{emulator.url}/v1/flux-2-pro"
    assert entries[4] == {"slot": 5, "state": "not_connected"}
    assert all(not e["reused"] for e in entries[:4])
    sizes = [saved_image(rig, result, f"save{n}").shape for n in range(1, 5)]
    assert sizes[1] == (1, 64, 64, 3) and sizes[2] == (1, 512, 512, 3)
    assert np.allclose(saved_image(rig, result, "save2")[0, 0, 0], [1.0, 0.0, 0.0])  # red
    assert np.allclose(saved_image(rig, result, "save3"), 1.0)  # white
    assert KEY not in json.dumps(report)


def saved_image(rig: Rig, result: Any, node: str) -> Any:
    from comfyfleet import imaging

    name = result.outputs[node]["images"][0]["filename"]
    return imaging.decode((rig.engine.folders.output / name).read_bytes())[0]


async def test_interrupt_cancels_remote_jobs_and_ends_interrupted(
    rig: Rig, emulator: Emulator
) -> None:
    emulator.settings.latency = 10.0
    graph = Graph(emulator.url)
    graph.collect("c", [graph.submit(f"s{n}", "long", seed=n) for n in range(5)])
    handle = RunHandle()
    running = asyncio.create_task(
        rig.engine.run_prompt(graph.prompt, sink=Recorder(), handle=handle)
    )
    await until(lambda: emulator.stats()["jobs"] == 5, "five jobs at the provider")
    await asyncio.sleep(0.1)  # their ids reach the journal
    handle.interrupt()
    _, result = await asyncio.wait_for(running, 5)
    assert result is not None and result.status == "interrupted"
    stats = emulator.stats()
    assert (stats["cancels"], stats["cancelled"]) == (5, 5)
    assert await journal_states(rig) == ["cancelled"] * 5
    assert await rig.store.live_remote_jobs() == []
    assert rig.service.pools["image"].running == 0


async def test_a_serial_provider_node_fails_its_prompt_unless_it_skips(
    rig: Rig, emulator: Emulator
) -> None:
    graph = Graph(emulator.url, key=f"env:{WRONG_ENV}")
    inputs = graph.flux_inputs("serial", seed=1)
    graph.prompt["f"] = {"class_type": "BFLFluxImage", "inputs": inputs}
    graph.save("save", "f", 0)
    result = await run(rig, graph.prompt)
    assert result.status == "error" and result.error is not None
    assert result.error["exception_type"] == "comfyfleet.provider_http.errors.ProviderError"
    assert "invalid API key" in result.error["exception_message"]
    graph.prompt["f"]["inputs"]["skip_error"] = True
    events = Recorder()
    result = await run(rig, graph.prompt, events)
    assert result.status == "success"
    texts = [getattr(e, "text", "") for e in events.events]
    assert any(t.startswith("skipped after an error: bfl:") for t in texts)
