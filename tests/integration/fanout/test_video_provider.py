"""The OpenAI-compatible videos provider through the fan-out: twins, the video collector,
SaveVideo, the journal, interrupts; and the video example through `comfyfleet run`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from comfyfleet.engine.run import ExecutionRequest, RunHandle
from comfyfleet.fanout.mp4 import read_info
from tests.integration.fanout.conftest import KEY, KEY_ENV, Emulator, MakeRig, Rig, start_emulator
from tests.integration.fanout.test_concurrency import run, status_of

EXAMPLES = Path(__file__).parents[3] / "examples"
SUBMIT = "Concurrent Submit | OpenAIVideo"
COLLECT = "Concurrent Collect Videos (10)"


def video_prompt(url: str, texts: list[str], *, save: bool = True) -> dict[str, Any]:
    settings = {"base_url": url, "api_key": f"env:{KEY_ENV}", "poll_interval": 0.05}
    prompt: dict[str, Any] = {"api": {"class_type": "APISettings", "inputs": settings}}
    for n, text in enumerate(texts, 1):
        inputs = {"prompt": text, "model": "sora-2", "seconds": "4", "size": "1280x720"}
        prompt[f"s{n}"] = {
            "class_type": SUBMIT,
            "inputs": {**inputs, "seed": n, "api_config": ["api", 0]},
        }
    tasks = {f"task_{n}": [f"s{n}", 0] for n in range(1, len(texts) + 1)}
    prompt["c"] = {"class_type": COLLECT, "inputs": {**tasks, "failure_mode": "fail_fast"}}
    if save:
        for n in range(1, len(texts) + 1):
            inputs = {
                "video": ["c", n - 1],
                "filename_prefix": f"video/clip{n}",
                "format": "auto",
                "codec": "auto",
            }
            prompt[f"save{n}"] = {"class_type": "SaveVideo", "inputs": inputs}
    return prompt


async def test_videos_fan_out_are_saved_and_a_rerun_pays_nothing(
    rig: Rig, emulator: Emulator, tmp_path: Path
) -> None:
    prompt = video_prompt(emulator.url, ["a boat", "a pond", "a bath"])
    result = await run(rig, prompt)
    assert result.status == "success", result.error
    report = status_of(result, "c")
    assert KEY not in json.dumps(result.outputs)  # the key is sent, never reported
    assert report["counts"] == {"success": 3, "not_connected": 7}
    assert {s["provider"] for s in report["slots"][:3]} == {"openai_videos"}
    saved = result.outputs["save2"]
    assert saved["animated"] == [True]
    [entry] = saved["images"]
    path = tmp_path / "output" / entry["subfolder"] / entry["filename"]
    assert entry["filename"].endswith(".mp4")
    info = read_info(path.read_bytes())
    assert (info.width, info.height, info.seconds) == (1280, 720, 4.0)
    stats = emulator.stats()
    assert (stats["jobs"], stats["duplicates"], stats["downloads"]) == (3, 0, 3)

    rig.engine.cache.clear()  # as a new process would: only the journal remembers
    again = await run(rig, prompt)
    assert again.status == "success", again.error
    assert [s["reused"] for s in status_of(again, "c")["slots"][:3]] == [True] * 3
    assert emulator.stats()["jobs"] == 3


async def test_a_restart_follows_the_video_jobs_it_left_running(
    make_rig: MakeRig, tmp_path: Path
) -> None:
    emulator = await start_emulator(latency=0.6)
    try:
        first = await make_rig()
        prompt = video_prompt(emulator.url, ["left running"], save=False)
        running = asyncio.ensure_future(run(first, prompt))
        while emulator.stats()["jobs"] < 1:
            await asyncio.sleep(0.01)
        await first.service.detach()  # the process goes away; the job stays at the provider
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await first.close()
        second = await make_rig()
        await second.service.resume()
        result = await run(second, prompt)
        assert result.status == "success", result.error
        assert emulator.stats()["jobs"] == 1  # followed, not sent again
    finally:
        await emulator.server.close()


async def test_an_interrupt_deletes_the_running_video_jobs(rig: Rig) -> None:
    emulator = await start_emulator(latency=5.0)
    try:
        handle = RunHandle()
        prompt = video_prompt(emulator.url, ["one", "two"], save=False)
        checked = await rig.engine.validate(prompt)
        assert checked.ok
        request = ExecutionRequest("p1", checked.prompt, checked.outputs, {})
        running = asyncio.ensure_future(rig.engine.execute(request, handle=handle))
        while emulator.stats()["jobs"] < 2:
            await asyncio.sleep(0.01)
        handle.interrupt()
        result = await asyncio.wait_for(running, 10)
        assert result.status != "success"
        assert emulator.stats()["cancelled"] == 2
    finally:
        await emulator.server.close()


async def test_the_video_example_runs_with_comfyfleet_run(tmp_path: Path) -> None:
    emulator = await start_emulator(latency=0.2, keys=[])
    try:
        for _ in range(2):
            process = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / "comfyfleet"),
                "run",
                str(EXAMPLES / "sora-concurrent.json"),
                "--set",
                f"API Settings.base_url={emulator.url}",
                "--set",
                "APISettings.poll_interval=0.1",
                "--output-dir",
                str(tmp_path / "out"),
                "--quiet",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")},
            )
            out, err = await asyncio.wait_for(process.communicate(), 60)
            assert process.returncode == 0, err.decode()
            lines = out.decode().splitlines()
            saved = sorted(Path(line).name[:10] for line in lines if line.endswith(".mp4"))
            assert saved == ["sora_bath_", "sora_pond_", "sora_rain_"]
            [report] = [line for line in lines if line.startswith("#5: ")]
            assert json.loads(report[4:])["counts"] == {"success": 3, "not_connected": 7}
        assert emulator.stats()["jobs"] == 3  # the second run reused the journal
    finally:
        await emulator.server.close()
