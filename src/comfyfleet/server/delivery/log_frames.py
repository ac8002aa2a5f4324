"""What the event log keeps of a prompt's binary frames: previews and progress text.

A binary frame is kept as the engine event it was built from, so each reader builds
the frames its socket takes (code 4 with metadata, or code 1 after the `progress` it
came with: client_events.ClientRouter), byte for byte what the running gateway sends:

- a preview: type `preview_image`, data `{"node_id", "format"}`, the image's bytes;
- progress text: type `progress_text`, data `{"node_id"}`, the text's UTF-8 bytes.

The log is thinned, never a socket. What is kept:

- every progress text (one over MAX_FRAME bytes is cut to its first MAX_FRAME bytes);
- every image an output node sends as a frame (SaveImageWebsocket: the image is the
  output) of at most MAX_OUTPUT_FRAME bytes, never thinned (data `"output": true`);
- a preview of at most MAX_FRAME bytes (a larger one is left out) while the prompt's
  logged previews stay within PREVIEW_RATE a second (bursts of PREVIEW_BURST);
- beyond the rate, the latest: a preview without a token is held, and the frames after
  it wait with it (a frame is never moved), until the first of
  - its node's next preview: the held one is left out, the newer one is held instead;
  - a token (at most 1/PREVIEW_RATE s): kept;
  - the end of its node's progress (any frame but its node's `progress`, its node still
    running in `progress_state`, or progress text), the prompt's end, or MAX_HELD frames
    waiting: kept. So the last preview before a node ends is always kept.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.domain.prompt_events import NewPromptEvent, PromptEvent
from comfyfleet.engine.events import PreviewImage, ProgressText
from comfyfleet.server.delivery.pacing import TokenBucket

PREVIEW = "preview_image"
TEXT = "progress_text"
#: The largest frame the log keeps (a preview's image, a progress text).
MAX_FRAME = 1 << 20
#: The largest image an output node's frame may carry in the log (a 4K PNG fits).
MAX_OUTPUT_FRAME = 1 << 25
#: Nodes whose binary frames are their output, not a preview of progress.
OUTPUT_FRAME_NODES = frozenset({"SaveImageWebsocket"})
#: Previews a second the log keeps of one prompt, after a burst of PREVIEW_BURST.
PREVIEW_RATE = 10.0
PREVIEW_BURST = 10.0
#: Frames that may wait behind a held preview.
MAX_HELD = 200


def to_log(
    prompt_id: str, event: PreviewImage | ProgressText, *, output: bool = False
) -> NewPromptEvent | None:
    """The log's form of a binary frame of `prompt_id` (`output`: an output node's image);
    None for an image over its cap."""
    if isinstance(event, PreviewImage):
        if len(event.data) > (MAX_OUTPUT_FRAME if output else MAX_FRAME):
            return None
        header: dict[str, Any] = {"node_id": event.node_id, "format": event.format}
        if output:
            header["output"] = True
        return NewPromptEvent(prompt_id, PREVIEW, header, event.data)
    text = event.text.encode()[:MAX_FRAME]
    return NewPromptEvent(prompt_id, TEXT, {"node_id": event.node_id}, text)


def from_log(event: PromptEvent) -> PreviewImage | ProgressText | None:
    """The binary frame a logged event holds; None for a JSON frame (or an unknown kind)."""
    if event.frame is None:
        return None
    node_id = str(event.data.get("node_id", ""))
    if event.type == PREVIEW:
        image_format = "PNG" if event.data.get("format") == "PNG" else "JPEG"
        return PreviewImage(event.prompt_id, node_id, image_format, event.frame)
    if event.type == TEXT:
        return ProgressText(event.prompt_id, node_id, event.frame.decode(errors="replace"))
    return None


@dataclass
class _Prompt:
    bucket: TokenBucket
    held: list[NewPromptEvent] = field(default_factory=list)  # a preview, then what follows
    timer: asyncio.TimerHandle | None = None


class PreviewThinning:
    """Decides which of a prompt's frames the log keeps, in their order (see the module's
    doc). `add` returns what to append now; what a timer releases goes to `release`."""

    def __init__(
        self,
        release: Callable[[list[NewPromptEvent]], None],
        *,
        rate: float = PREVIEW_RATE,
        burst: float = PREVIEW_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._release = release
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._prompts: dict[str, _Prompt] = {}

    def add(self, event: NewPromptEvent) -> list[NewPromptEvent]:
        state = self._prompts.get(event.prompt_id)
        if event.type != PREVIEW or event.frame is None or event.data.get("output"):
            if state is None or not state.held:
                return [event]
            if _continues(event, state.held[0]) and len(state.held) < MAX_HELD:
                state.held.append(event)
                return []
            return [*self._keep(state), event]
        if state is None:
            state = self._prompts[event.prompt_id] = _Prompt(
                TokenBucket(self._rate, self._burst, self._clock)
            )
        ready: list[NewPromptEvent] = []
        if state.held:
            if state.held[0].data.get("node_id") == event.data.get("node_id"):
                ready = state.held[1:]  # superseded by its node's newer preview
                state.held = []
            else:
                ready = self._keep(state)
        if state.bucket.wait() <= 0:
            state.bucket.take()
            return [*ready, event]
        state.held = [event]
        if state.timer is None:
            delay = max(0.0, state.bucket.wait())
            state.timer = asyncio.get_running_loop().call_later(delay, self._due, event.prompt_id)
        return ready

    def end(self, prompt_id: str) -> list[NewPromptEvent]:
        """The prompt's end (or its going back to the queue): what it holds, kept."""
        state = self._prompts.pop(prompt_id, None)
        if state is None:
            return []
        if state.timer is not None:
            state.timer.cancel()
        return state.held

    def end_all(self) -> list[NewPromptEvent]:
        return [event for prompt_id in list(self._prompts) for event in self.end(prompt_id)]

    def _keep(self, state: _Prompt) -> list[NewPromptEvent]:
        held, state.held = state.held, []
        if held:
            state.bucket.take()  # may go into debt: a kept preview counts all the same
        return held

    def _due(self, prompt_id: str) -> None:
        state = self._prompts.get(prompt_id)
        if state is None:
            return
        state.timer = None
        if not state.held:
            return
        wait = state.bucket.wait()
        if wait > 0:  # a kept preview took the token meanwhile
            state.timer = asyncio.get_running_loop().call_later(wait, self._due, prompt_id)
        else:
            self._release(self._keep(state))


def _continues(event: NewPromptEvent, preview: NewPromptEvent) -> bool:
    """Whether `event` leaves the held preview's node still reporting progress."""
    node = preview.data.get("node_id")
    if event.type == TEXT and event.frame is not None:
        return True
    if event.frame is not None:
        return False
    if event.type == "progress":
        return bool(event.data.get("node") == node)
    if event.type == "progress_state":
        nodes = event.data.get("nodes")
        entry = nodes.get(node) if isinstance(nodes, dict) and isinstance(node, str) else None
        return isinstance(entry, dict) and entry.get("state") == "running"
    return False
