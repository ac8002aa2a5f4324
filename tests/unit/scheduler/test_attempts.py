"""How an attempt's intended end may change: a cancel always wins, nothing leaves it, and a
failed take-back returns the attempt to running only if nothing else happened meanwhile."""

from __future__ import annotations

import pytest

from comfyfleet.domain.jobs import NewJob
from comfyfleet.lanes.local import LocalLane
from comfyfleet.scheduler.attempts import AttemptState, EventGate, Running

S = AttemptState


def attempt() -> Running:
    job = NewJob("p", 0, False, {}, {}, []).pending(1, 0.0)
    lane = LocalLane.__new__(LocalLane)  # never run: only its identity is held
    return Running(job, lane, EventGate(None))


@pytest.mark.parametrize(
    ("path", "final"),
    [
        ([S.TAKING_BACK, S.RUNNING], S.RUNNING),
        ([S.TAKING_BACK, S.CANCELLING, S.RUNNING], S.CANCELLING),
        ([S.GIVING_BACK, S.RUNNING], S.GIVING_BACK),
        ([S.GIVING_BACK, S.TAKING_BACK], S.GIVING_BACK),
        ([S.GIVING_BACK, S.CANCELLING], S.CANCELLING),
        ([S.CANCELLING, S.GIVING_BACK, S.TAKING_BACK, S.RUNNING], S.CANCELLING),
        ([S.TAKING_BACK, S.GIVING_BACK], S.GIVING_BACK),
    ],
)
def test_transitions(path: list[AttemptState], final: AttemptState) -> None:
    run = attempt()
    for state in path:
        run.to(state)
    assert run.state is final


def test_a_refused_change_says_so_and_changes_nothing() -> None:
    run = attempt()
    assert run.to(S.CANCELLING)
    assert not run.to(S.GIVING_BACK)
    assert run.state is S.CANCELLING
