"""The OpenAI-compatible videos provider through the fan-out: twins, the video collector,
SaveVideo, the journal, interrupts; and the video example through `comfyfleet run`."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from comfyfleet.engine.run import ExecutionRequest, RunHandle
from comfyfleet.fanout.mp4 import read_info
from tests.emulators import Emulator
from tests.helpers import Recorder
from tests.integration.fanout.conftest import KEY, KEY_ENV, WRONG_ENV, MakeRig, Rig, start_emulator
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
            saved: dict[str, Any] = {
                "video": ["c", n - 1],
                "filename_prefix": f"video/clip{n}",
                "format": "auto",
                "codec": "auto",
            }
            prompt[f"save{n}"] = {"class_type": "SaveVideo", "inputs": saved}
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


def saved_info(result: Any, node: str, root: Path) -> Any:
    [entry] = result.outputs[node]["images"]
    assert entry["filename"].endswith(".mp4")
    return read_info((root / "output" / entry["subfolder"] / entry["filename"]).read_bytes())


async def test_a_failed_video_job_that_skips_errors_gives_a_white_clip(
    rig: Rig, emulator: Emulator, tmp_path: Path
) -> None:
    prompt = video_prompt(emulator.url, ["a boat", "refused"])
    wrong = {"base_url": emulator.url, "api_key": f"env:{WRONG_ENV}", "poll_interval": 0.05}
    prompt["wrong"] = {"class_type": "APISettings", "inputs": wrong}
    prompt["s2"]["inputs"].update(api_config=["wrong", 0], skip_error=True)
    result = await run(rig, prompt)  # fail_fast: a skipped slot does not trip it
    assert result.status == "success", result.error
    report = status_of(result, "c")
    assert report["counts"] == {"success": 1, "skipped_error": 1, "not_connected": 8}
    skipped = report["slots"][1]
    assert (skipped["error_class"], skipped["http_status"]) == ("ProviderError", 403)
    assert "invalid API key" in skipped["error"]
    info = saved_info(result, "save2", tmp_path)
    assert (info.width, info.height, info.frames, info.seconds) == (512, 512, 8, 1.0)
    assert saved_info(result, "save1", tmp_path).width == 1280  # the good one, as it came

    # The serial node the same way: its prompt goes on, and says the job was skipped.
    serial = video_prompt(emulator.url, [], save=False)
    inputs = {**prompt["s2"]["inputs"], "seed": 7}
    serial["wrong"] = prompt["wrong"]
    serial["v"] = {"class_type": "OpenAIVideo", "inputs": inputs}
    serial["save"] = {**prompt["save1"], "inputs": {**prompt["save1"]["inputs"], "video": ["v", 0]}}
    del serial["c"]
    events = Recorder()
    result = await run(rig, serial, events)
    assert result.status == "success", result.error
    assert saved_info(result, "save", tmp_path).width == 512
    texts = [getattr(e, "text", "") for e in events.events]
    assert any(t.startswith("skipped after an error: openai_videos:") for t in texts)


def clip_files() -> set[Path]:
    """Every clip file of the fan-out's video folder (every process's)."""
    return set((Path(tempfile.gettempdir()) / "comfyfleet-videos").rglob("*.mp4"))


async def test_no_downloaded_clip_is_left_once_nothing_holds_its_video(
    rig: Rig, emulator: Emulator
) -> None:
    before = clip_files()
    texts = [f"kept {uuid.uuid4().hex}", f"kept {uuid.uuid4().hex}"]
    result = await run(rig, video_prompt(emulator.url, texts))
    assert result.status == "success", result.error
    # The engine's cache holds the outputs (a re-run saves them again): the files stay.
    made = clip_files() - before
    assert len(made) == 2 and all(path.stat().st_size > 0 for path in made)
    again = await run(rig, video_prompt(emulator.url, texts))
    assert again.status == "success", again.error
    assert emulator.stats()["downloads"] == 2
    rig.engine.cache.clear()
    # Gone once nothing holds their values (the fan-out's interrupt watch lets the
    # prompt go on its next beat).
    async with asyncio.timeout(5):
        while made & clip_files():
            gc.collect()
            await asyncio.sleep(0.02)


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
