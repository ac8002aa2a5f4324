"""What the event log keeps of binary frames: the round trip of previews and progress
text, and the thinning of previews beyond the rate (the latest kept, nothing moved)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from comfyfleet.domain.prompt_events import NewPromptEvent, PromptEvent
from comfyfleet.engine.events import PreviewImage, ProgressText
from comfyfleet.server.delivery import log_frames
from comfyfleet.server.delivery.log_frames import MAX_FRAME, PreviewThinning, from_log, to_log

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def preview(n: int, node: str = "3") -> NewPromptEvent:
    logged = to_log("p", PreviewImage("p", node, "PNG", bytes([n]) * 10))
    assert logged is not None
    return logged


def message(kind: str, **data: Any) -> NewPromptEvent:
    return NewPromptEvent("p", kind, {"prompt_id": "p", **data})


def progress(value: int, node: str = "3") -> NewPromptEvent:
    return message("progress", value=value, max=10, node=node)


def running(node: str = "3", state: str = "running") -> NewPromptEvent:
    return message("progress_state", nodes={node: {"state": state, "value": 1, "max": 10}})


def text(words: str, node: str = "3") -> NewPromptEvent:
    logged = to_log("p", ProgressText("p", node, words))
    assert logged is not None
    return logged


def as_read(event: NewPromptEvent) -> PromptEvent:
    return PromptEvent(1, event.prompt_id, event.type, event.data, 0.0, event.frame)


def test_previews_and_progress_text_come_back_as_the_frames_they_were() -> None:
    image = PreviewImage("p", "7", "JPEG", b"\xff\xd8 jpeg bytes")
    words = ProgressText("p", "7", "width: 8\n é")
    for frame in (image, words):
        logged = to_log("p", frame)
        assert logged is not None and logged.frame is not None
        assert from_log(as_read(logged)) == frame
    assert from_log(as_read(message("progress", value=1))) is None  # a JSON frame


def test_a_preview_over_the_cap_is_left_out_and_long_text_is_cut() -> None:
    assert to_log("p", PreviewImage("p", "1", "PNG", b"x" * MAX_FRAME)) is not None
    assert to_log("p", PreviewImage("p", "1", "PNG", b"x" * (MAX_FRAME + 1))) is None
    cut = to_log("p", ProgressText("p", "1", "y" * (MAX_FRAME + 5)))
    assert cut is not None and cut.frame == b"y" * MAX_FRAME


async def test_within_the_rate_every_frame_is_kept_in_order() -> None:
    released: list[NewPromptEvent] = []
    thinning = PreviewThinning(released.extend, rate=1, burst=3, clock=Clock())
    stream = [running(), preview(0), progress(0), text("a"), preview(1), progress(1), preview(2)]
    kept = [e for event in stream for e in thinning.add(event)]
    assert kept == stream and released == []
    assert thinning.end("p") == []


async def test_beyond_the_rate_the_latest_preview_is_kept_and_nothing_moves() -> None:
    released: list[NewPromptEvent] = []
    clock = Clock()
    thinning = PreviewThinning(released.extend, rate=1, burst=1, clock=clock)
    kept: list[NewPromptEvent] = []

    def add(*events: NewPromptEvent) -> None:
        for event in events:
            kept.extend(thinning.add(event))

    add(running(), preview(0), progress(0))  # the burst: kept at once
    add(running(), preview(1), progress(1), running(), text("t1"))  # no token: held
    assert kept == [running(), preview(0), progress(0), running()]
    add(preview(2))  # its node's newer preview: 1 is left out, what followed it goes on
    assert kept[4:] == [progress(1), running(), text("t1")]
    add(progress(2), preview(3, node="9"))  # another node's preview: 2 was its node's last
    assert kept[7:] == [preview(2), progress(2)]
    add(progress(0, node="9"), running(node="9", state="finished"))  # node 9 ends: 3 kept
    assert kept[9:] == [
        preview(3, node="9"),
        progress(0, node="9"),
        running(node="9", state="finished"),
    ]
    assert released == []
    # Previews of the frames a client got: 0, 2, 3 (1 left out); every other frame once.
    previews = [e.frame[0] for e in kept if e.type == log_frames.PREVIEW and e.frame]
    assert previews == [0, 2, 3]
    assert sum(e.type == log_frames.TEXT for e in kept) == 1


async def test_the_end_of_a_prompt_keeps_what_it_held() -> None:
    thinning = PreviewThinning(lambda _: None, rate=1, burst=1, clock=Clock())
    assert thinning.add(preview(0)) == [preview(0)]
    assert thinning.add(preview(1)) == []
    assert thinning.add(progress(1)) == []
    assert thinning.end("p") == [preview(1), progress(1)]
    assert thinning.add(progress(2)) == [progress(2)]  # nothing held any more


async def test_a_held_preview_is_kept_once_a_token_is_due() -> None:
    released: list[NewPromptEvent] = []
    thinning = PreviewThinning(released.extend, rate=20, burst=1)
    assert thinning.add(preview(0)) == [preview(0)]
    assert thinning.add(preview(1)) == []
    assert thinning.add(progress(1)) == []
    async with asyncio.timeout(5):
        while not released:
            await asyncio.sleep(0.01)
    assert released == [preview(1), progress(1)]
    assert thinning.add(progress(2)) == [progress(2)]


async def test_an_output_nodes_images_are_never_thinned_and_may_be_large() -> None:
    """SaveImageWebsocket's frames are its output: a batch sent at once reaches a client
    on another gateway whole, each image up to MAX_OUTPUT_FRAME bytes."""
    big = PreviewImage("p", "9", "PNG", b"\x89PNG" + b"x" * (2 * MAX_FRAME))
    assert to_log("p", big) is None  # as a preview it would be left out
    outputs = [to_log("p", big, output=True) for _ in range(5)]
    assert all(o is not None and o.data["output"] is True for o in outputs)
    too_big = PreviewImage("p", "9", "PNG", b"x" * (log_frames.MAX_OUTPUT_FRAME + 1))
    assert to_log("p", too_big, output=True) is None
    released: list[NewPromptEvent] = []
    thinning = PreviewThinning(released.extend, rate=1, burst=1, clock=Clock())
    kept = [kept for o in outputs if o is not None for kept in thinning.add(o)]
    assert kept == outputs  # all five at once, in order, beyond a rate of one
    assert released == [] and thinning.end("p") == []
