"""The shipped examples validate, and run against the emulator (also through `comfyfleet run`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.validation import validate_prompt
from tests.integration.fanout.conftest import start_emulator

EXAMPLES = Path(__file__).parents[3] / "examples"


def load(name: str) -> dict[str, Any]:
    prompt: dict[str, Any] = json.loads((EXAMPLES / name).read_text())
    return prompt


@pytest.mark.parametrize("name", ["flux-concurrent.json", "flux-concurrent-30.json"])
async def test_examples_validate(nodes: NodeRegistry, name: str) -> None:
    prompt = load(name)
    checked = await validate_prompt(nodes, prompt)
    assert checked.ok, checked.node_errors
    assert prompt["1"]["inputs"]["base_url"] == "http://127.0.0.1:8299"  # the emulator
    submits = [n for n in prompt.values() if n["class_type"].startswith("Concurrent Submit")]
    assert len(submits) == (2 if name == "flux-concurrent.json" else 30)
    assert len({n["inputs"]["prompt"] for n in submits}) == len(submits)


async def run_example(emulator: Any, tmp_path: Path, *flags: str) -> tuple[int, str, str]:
    """`comfyfleet run` on the two-job example, its journal under tmp_path by default."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "comfyfleet"),
        "run",
        str(EXAMPLES / "flux-concurrent.json"),
        "--set",
        f"API Settings.base_url={emulator.url}",  # by the node's title
        "--set",
        "APISettings.poll_interval=0.1",  # by its class
        "--output-dir",
        str(tmp_path / "out"),
        "--quiet",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")},
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def collector_report(out: str) -> dict[str, Any]:
    [report] = [line for line in out.splitlines() if line.startswith("#4: ")]
    body: dict[str, Any] = json.loads(report[4:])
    return body


async def test_the_example_runs_with_comfyfleet_run(tmp_path: Path) -> None:
    emulator = await start_emulator(latency=0.2, keys=[])
    try:
        code, out, err = await run_example(emulator, tmp_path)
        assert code == 0, err
        saved = sorted(Path(line).name for line in out.splitlines() if line.endswith(".png"))
        expected = ["flux_concurrent_dawn_0", "flux_concurrent_night_"]
        assert [name[:22] for name in saved] == expected
        assert collector_report(out)["counts"] == {"success": 2, "not_connected": 28}
        assert emulator.stats()["jobs"] == 2
        # The journal is a file in the user's data folder: running again pays nothing.
        assert (tmp_path / "data" / "comfyfleet" / "run-journal.db").is_file()
        code, out, err = await run_example(emulator, tmp_path)
        assert code == 0, err
        assert [s["reused"] for s in collector_report(out)["slots"][:2]] == [True, True]
        assert emulator.stats()["jobs"] == 2
        # Another journal file starts empty; no journal at all pays every time.
        code, _, err = await run_example(emulator, tmp_path, "--journal", str(tmp_path / "j.db"))
        assert code == 0, err
        assert emulator.stats()["jobs"] == 4
        code, _, err = await run_example(emulator, tmp_path, "--no-journal")
        assert code == 0, err
        assert emulator.stats()["jobs"] == 6
    finally:
        await emulator.server.close()
