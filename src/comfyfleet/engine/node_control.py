"""The side of a run its nodes see (engine/context.py RunControl): whether to stop, and
their progress and text, brought to the loop from whichever thread the node runs in."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Protocol

from comfyfleet.engine.context import Preview
from comfyfleet.engine.events import Message, PreviewImage, ProgressText
from comfyfleet.engine.progress import ProgressTracker
from comfyfleet.protocol import events


class Stops(Protocol):
    """What the run's handle says of stopping (engine/run.py RunHandle)."""

    @property
    def interrupted(self) -> bool: ...

    @property
    def held_back(self) -> bool: ...


class NodeControl:
    def __init__(
        self, prompt_id: str, stops: Stops, tracker: ProgressTracker, emit: Callable[[Any], None]
    ) -> None:
        self.prompt_id = prompt_id
        self._stops = stops
        self._tracker = tracker
        self._emit = emit
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # A node was told it is interrupted because the run is held back: its stop
        # sets it back to run again (see RunHandle), rather than ending the run.
        self.told_held_back = False

    @property
    def interrupted(self) -> bool:
        return self._stops.interrupted

    @property
    def stopping(self) -> bool:
        if self._stops.interrupted:
            return True
        if self._stops.held_back:
            self.told_held_back = True
            return True
        return False

    def report_progress(
        self, node_id: str, value: float, total: float, preview: Preview | None
    ) -> None:
        self.on_loop(self._progress, node_id, value, total, preview)

    def send_text(self, node_id: str, text: str) -> None:
        self.on_loop(self._emit, ProgressText(self.prompt_id, node_id, text))

    def on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Call `fn` now when on the loop's thread, else soon on the loop."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def _progress(self, node_id: str, value: float, total: float, preview: Preview | None) -> None:
        self._tracker.update(node_id, value, total)
        if preview is not None:
            self._emit(PreviewImage(self.prompt_id, node_id, preview.format, preview.data))
        self._emit(Message("progress", events.progress(self.prompt_id, node_id, value, total)))
