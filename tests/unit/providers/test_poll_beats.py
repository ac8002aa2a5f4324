"""When the BFL client polls: a fixed beat, fewer polls while progress says the job is far off."""

from __future__ import annotations

import math

import pytest

from comfyfleet.nodes.providers.bfl.client import SKIP_AT_MOST, next_beat


def polls_until_done(duration: float, interval: float, answer: float = 0.0) -> list[int]:
    """The beats a job of `duration` seconds with steady progress is polled at, when each
    answer takes `answer` seconds."""
    beats = [0]
    while beats[-1] * interval < duration:
        elapsed = beats[-1] * interval + answer
        progress = round(min(1.0, elapsed / duration), 3)  # as providers round it
        beats.append(next_beat(beats[-1], elapsed, interval, progress))
    return beats


def test_without_progress_every_beat_is_polled_and_slow_answers_skip_beats() -> None:
    assert next_beat(0, 0.01, 0.1, None) == 1
    assert next_beat(4, 0.42, 0.1, None) == 5
    assert next_beat(4, 0.75, 0.1, None) == 8  # the answer took three beats
    assert next_beat(4, 0.42, 0.1, 0.0) == 5  # no pace to go by yet
    assert next_beat(4, 0.42, 0.1, 1.0) == 5


@pytest.mark.parametrize("duration", [0.5, 2.0, 7.3, 60.0])
@pytest.mark.parametrize("interval", [0.02, 0.1, 1.0])
def test_a_steady_job_is_seen_done_on_the_first_beat_after_it_ends(
    duration: float, interval: float
) -> None:
    beats = polls_until_done(duration, interval, answer=0.004)
    assert beats[-1] == math.ceil(duration / interval - 1e-9)
    assert beats == sorted(set(beats))


def test_far_from_done_most_beats_are_skipped() -> None:
    beats = polls_until_done(2.0, 0.1)
    assert len(beats) <= 9  # against 21 on every beat


def test_a_misleading_pace_skips_at_most_a_second() -> None:
    # 1 % after 10 s: the pace says 990 s to go; the job may be about to finish.
    beat = next_beat(100, 10.0, 0.1, 0.01)
    assert (beat - 100) * 0.1 <= SKIP_AT_MOST + 1e-9
