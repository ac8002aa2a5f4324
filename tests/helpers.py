"""Test helpers: recorded reference data and an event recorder."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from comfyfleet.engine.events import EngineEvent, Message, NodeProgress
from comfyfleet.protocol.progress import ProgressState

DATA = Path(__file__).parent / "data"
REFERENCE = DATA / "comfyui-reference"


def load_scenario(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REFERENCE / "scenarios" / f"{name}.json").read_text())
    return data


class Recorder:
    """An event sink that keeps everything, for assertions."""

    def __init__(self) -> None:
        self.events: list[EngineEvent] = []

    def __call__(self, event: EngineEvent) -> None:
        self.events.append(event)

    def messages(self, *types: str) -> list[Message]:
        """The JSON frames a client of these prompts gets: each node's progress change as
        the whole `progress_state`, as ComfyUI sends it."""
        found: list[Message] = []
        progress: dict[str, ProgressState] = {}
        for event in self.events:
            if isinstance(event, NodeProgress):
                state = progress.setdefault(event.prompt_id, ProgressState(event.prompt_id))
                state.change(event.node_id, event.entry)
                found.append(Message("progress_state", state.frame()))
            elif isinstance(event, Message):
                found.append(event)
        return [m for m in found if not types or m.type in types]

    def types(self) -> list[str]:
        return [m.type for m in self.messages()]


def as_older_schema(path: Path, version: int, *statements: str) -> None:
    """Turn a store file back into what schema `version` wrote: run `statements` (the
    undoing of later migrations), then set its user_version."""
    with closing(sqlite3.connect(path)) as conn:
        for statement in statements:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.commit()


class FakeTime:
    """A clock that only moves when something sleeps on it; records each sleep."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
