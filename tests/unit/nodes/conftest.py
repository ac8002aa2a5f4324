"""Fixtures for calling node functions directly, as the engine would."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

from comfyfleet.engine.context import (
    NodeContext,
    Preview,
    reset_current_node,
    set_current_node,
)
from comfyfleet.folders import Folders, using_folders


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[Folders]:
    """Fresh input/output/temp folders, active for the test."""
    with using_folders(Folders.under(tmp_path).ensure()) as active:
        yield active


@dataclass
class RecordingControl:
    """A stand-in for the engine's per-prompt RunControl that records what nodes report.

    `interrupt_after` flips `interrupted` once that many progress reports have arrived.
    """

    interrupt_after: int | None = None
    progress: list[tuple[str, float, float]] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def interrupted(self) -> bool:
        return self.interrupt_after is not None and len(self.progress) >= self.interrupt_after

    @property
    def stopping(self) -> bool:
        return self.interrupted

    def report_progress(
        self, node_id: str, value: float, total: float, preview: Preview | None
    ) -> None:
        with self.lock:
            self.progress.append((node_id, value, total))

    def send_text(self, node_id: str, text: str) -> None:
        with self.lock:
            self.texts.append((node_id, text))


class AsNode(Protocol):
    """The `as_node` fixture: `with as_node("4") as control:`."""

    def __call__(
        self, node_id: str = ..., interrupt_after: int | None = ...
    ) -> contextlib.AbstractContextManager[RecordingControl]: ...


@contextlib.contextmanager
def _running_as(
    node_id: str = "4", interrupt_after: int | None = None
) -> Iterator[RecordingControl]:
    control = RecordingControl(interrupt_after=interrupt_after)
    token = set_current_node(NodeContext("prompt-1", node_id, node_id, None, control))
    try:
        yield control
    finally:
        reset_current_node(token)


@pytest.fixture
def as_node() -> AsNode:
    """`with as_node("4") as control:` runs the block as node 4 of a prompt, recording reports."""
    return _running_as
