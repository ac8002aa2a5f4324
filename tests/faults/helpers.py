"""Blocking helpers shared by the fault tests (the fleet harness does the rest)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.integration.fleet.harness import call
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

PREFIX_OF = re.compile(r"^(?P<prefix>.+)_\d{5}_\.png$")


def save_sleep_prompt(prefix: str, seconds: float, color: int = 0) -> dict[str, Any]:
    """EmptyImage(8x8) -> Sleep(seconds) -> SaveImage(prefix): one output file per run."""
    return sleep_prompt(seconds, color, output="SaveImage", prefix=prefix)


def job_counts(server: ServerProcess) -> dict[str, int]:
    """Jobs per API status (pending, in_progress, completed, failed, ...), from the jobs API."""
    counts: dict[str, int] = {}
    for status in ("pending", "in_progress", "completed", "failed", "interrupted", "cancelled"):
        code, body = call(server.url, "GET", f"/api/jobs?status={status}&limit=1")
        assert code == 200, body
        counts[status] = int(body["pagination"]["total"])
    return counts


def output_files(data_dir: Path) -> Counter[str]:
    """Saved PNGs under data_dir/output, counted per filename prefix."""
    found: Counter[str] = Counter()
    for path in (data_dir / "output").rglob("*.png"):
        match = PREFIX_OF.match(path.name)
        if match:
            found[match["prefix"]] += 1
    return found


def assert_outputs_present(data_dir: Path, history: dict[str, Any], ids: Iterable[str]) -> None:
    """Every image a history entry names exists in the output folder."""
    missing = []
    for prompt_id in ids:
        for output in history[prompt_id]["outputs"].values():
            for image in output.get("images", []):
                path = data_dir / "output" / image["subfolder"] / image["filename"]
                if not path.is_file():
                    missing.append((prompt_id, str(path)))
    assert missing == [], missing[:10]
