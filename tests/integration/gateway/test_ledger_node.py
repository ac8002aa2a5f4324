"""The testing pack's `LedgerAppend`: one line per run in the file the process's
environment names, saying which prompt and attempt ran it; the image it returns carries
the run's token, so a saved file tells which run wrote it. A run killed before its side
effect leaves no line: only the attempt that completed it appends."""

from __future__ import annotations

import io
import json
import os
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from comfyfleet.nodes import testing
from comfyfleet.testing import LEDGER_ENV
from tests.integration.gateway.processes import job, poll, submit
from tests.integration.gateway.wire import serve
from tests.servers import ServerProcess


def ledger_prompt(tag: str, seconds: float) -> dict[str, Any]:
    return {
        "1": {"class_type": "LedgerAppend", "inputs": {"tag": tag, "seconds": seconds}},
        "2": {
            "class_type": "SaveImage",
            "inputs": {"images": ["1", 0], "filename_prefix": f"ledger/{tag}"},
        },
    }


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def token_of(png: bytes) -> str:
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint8)
    return pixels.reshape(-1)[: testing.TOKEN_BYTES].tobytes().hex()


async def test_each_run_appends_one_line_naming_its_prompt_and_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    async with serve(tmp_path / "data", local_slots=4) as served:
        ids = {await served.submit(ledger_prompt(f"p{n}", 0.05)): f"p{n}" for n in range(3)}
        entries = {p: await served.wait_history(p) for p in ids}
        written = {line["prompt_id"]: line for line in lines(ledger)}
        assert len(lines(ledger)) == 3 and set(written) == set(ids)
        for prompt_id, tag in ids.items():
            line = written[prompt_id]
            assert (line["tag"], line["attempt"], line["lane"]) == (tag, 1, "local")
            assert (line["node"], line["pid"]) == ("1", os.getpid())
            [image] = entries[prompt_id]["outputs"]["2"]["images"]
            query = urllib.parse.urlencode(image)
            async with served.session.get(f"{served.url}/view?{query}") as response:
                assert response.status == 200
                assert token_of(await response.read()) == line["token"]
        # Each run is a run of its own: the same prompt again appends again.
        again = await served.submit(ledger_prompt("p0", 0.0))
        await served.wait_history(again)
        assert [line["prompt_id"] for line in lines(ledger)][-1] == again
        assert len({line["token"] for line in lines(ledger)}) == 4


def test_a_run_killed_before_its_side_effect_leaves_no_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    data = tmp_path / "data"
    first = ServerProcess(data).start()
    try:
        prompt_id = submit(first, ledger_prompt("k", 3.0))
        poll(lambda: job(first, prompt_id)["status"] == "in_progress", what="the run to start")
    finally:
        first.kill()
    assert not ledger.exists()
    with ServerProcess(data) as second:
        poll(lambda: job(second, prompt_id)["status"] == "completed", what="the second attempt")
        assert second.proc is not None
        [line] = lines(ledger)
        assert (line["prompt_id"], line["attempt"], line["pid"]) == (prompt_id, 2, second.proc.pid)


async def test_without_a_ledger_the_node_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    with pytest.raises(RuntimeError, match=LEDGER_ENV):
        await testing.LedgerAppend().append(tag="t", seconds=0.0)


def test_the_token_survives_saving_to_eight_bits() -> None:
    token = bytes(range(256 - testing.TOKEN_BYTES, 256))
    image = testing.token_image(token)
    saved = np.clip(image[0] * 255.0, 0, 255).astype(np.uint8)  # SaveImage truncates
    assert saved.reshape(-1)[: len(token)].tobytes() == token
