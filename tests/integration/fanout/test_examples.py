"""The shipped examples validate, and run against the emulator (also through `comfyfleet run`)."""

from __future__ import annotations

import asyncio
import json
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


async def test_the_example_runs_with_comfyfleet_run(tmp_path: Path) -> None:
    emulator = await start_emulator(latency=0.2, keys=[])
    try:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "comfyfleet"),
            "run",
            str(EXAMPLES / "flux-concurrent.json"),
            "--set",
            f"1.base_url={emulator.url}",
            "--set",
            "1.poll_interval=0.1",
            "--output-dir",
            str(tmp_path),
            "--quiet",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        await emulator.server.close()
    assert process.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    saved = sorted(Path(line).name for line in lines if line.endswith(".png"))
    assert [name[:22] for name in saved] == ["flux_concurrent_dawn_0", "flux_concurrent_night_"]
    [report] = [line for line in lines if line.startswith("#4: ")]  # the collector's status
    assert json.loads(report[4:])["counts"] == {"success": 2, "not_connected": 28}
    assert emulator.stats()["jobs"] == 2
