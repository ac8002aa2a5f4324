"""The chaos suite's checker (chaos/checker.py) on histories made by hand: what counts as
a side effect run twice, one of a fenced-out run, a re-run a fault made necessary, a
stale file and a wrong event stream. The suite itself (`make chaos`) is not run here."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "chaos"))
from audit import Change
from checker import Line, Observation, Verdict, Window, judge
from cluster import Signalled
from comfyfleet.nodes.testing import token_image
from receiver import Delivery
from workload import Submitted

P = "prompt-1"
GATEWAYS = ["g1", "g2", "g3"]
FILE = "s1-0000_00001_.png"
STREAM = ["execution_start", "executing", "executed", "execution_success", "done"]


def png(token: str) -> bytes:
    pixels = np.clip(token_image(bytes.fromhex(token))[0] * 255.0, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def change(status: str, attempt: int, at: float, owner: str | None, lane: str | None) -> Change:
    return Change(P, status, attempt, lane, owner, at)


def line(process: str, attempt: int | None, at: float, pid: int, token: str) -> Line:
    return Line(process, P, attempt, pid, token, at)


def observed(
    changes: list[Change],
    lines: list[Line],
    recorder: str,
    served: str,
    journal: tuple[Signalled, ...] = (),
    **overrides: Any,
) -> Observation:
    """One prompt, ended by `recorder`, whose file every gateway serves as `served`'s."""
    entry = {
        "prompt": [0, P, {}, {}, ["2"]],
        "outputs": {"2": {"images": [{"filename": FILE, "subfolder": "chaos", "type": "output"}]}},
        "status": {"status_str": "success", "completed": True, "messages": []},
    }
    seen = Observation(
        prompts=[Submitted(P, "s1-0000", 0.5, 0.0, acked_at=0.1, acked_by="g1")],
        gateways=GATEWAYS,
        histories={g: {P: entry} for g in GATEWAYS},
        jobs={P: {"status": "completed", "gateway": recorder}},
        views={(P, FILE): {g: png(served) for g in GATEWAYS}},
        streams={P: STREAM},
        lines=lines,
        torn_lines=0,
        changes={P: changes},
        journal=list(journal),
        deliveries=[Delivery("msg_1", "job.succeeded", P, 1, 9.0)],
        faults=[Window("pause-gateway", "pause-gateway g1", 1.0)],
    )
    for name, value in overrides.items():
        setattr(seen, name, value)
    return seen


def figures(v: Verdict) -> dict[str, int]:
    names = ("lost", "ran_twice", "fenced_out", "stale_files", "stream_errors", "cut_short")
    return {name: getattr(v, name) for name in names if getattr(v, name)}


A, B = "aa" * 16, "bb" * 16


def test_one_run_one_side_effect_is_clean() -> None:
    seen = observed(
        [change("running", 1, 1.0, "g1", "local"), change("success", 1, 2.1, "g1", "local")],
        [line("g1", 1, 2.0, 101, A)],
        recorder="g1",
        served=A,
    )
    verdict = judge(seen, 0.0)
    assert verdict.failures() == 0 and figures(verdict) == {}


def test_a_gateway_killed_after_its_side_effect_may_run_the_prompt_again() -> None:
    # g1 did the side effect and was killed before recording the end: g2 runs it again.
    seen = observed(
        [
            change("running", 1, 1.0, "g1", "local"),
            change("pending", 1, 6.0, None, None),
            change("running", 2, 6.1, "g2", "local"),
            change("success", 2, 7.2, "g2", "local"),
        ],
        [line("g1", 1, 2.0, 101, A), line("g2", 2, 7.0, 102, B)],
        recorder="g2",
        served=B,
        journal=(Signalled(2.5, "g1", 101, "SIGKILL"),),
    )
    verdict = judge(seen, 0.0)
    assert verdict.failures() == 0
    assert (verdict.cut_short, verdict.reruns) == (1, 1)


def test_a_paused_gateway_that_finishes_after_the_takeover_is_caught() -> None:
    # g1 paused mid-run past its lease; g2 re-ran the prompt; g1 woke and did its effect.
    changes = [
        change("running", 1, 1.0, "g1", "local"),
        change("pending", 1, 5.0, None, None),
        change("running", 2, 5.1, "g2", "local"),
        change("success", 2, 6.5, "g2", "local"),
    ]
    journal = [Signalled(1.5, "g1", 101, "SIGSTOP"), Signalled(8.0, "g1", 101, "SIGCONT")]
    late = [line("g2", 2, 6.0, 102, B), line("g1", 1, 8.1, 101, A)]
    verdict = judge(observed(changes, late, "g2", B, tuple(journal)), 0.0)
    assert figures(verdict) == {"ran_twice": 1, "fenced_out": 1}
    assert any("3.10s after the store moved on" in p for p in verdict.problems)
    assert all("after pause-gateway g1" in p for p in verdict.problems)
    # Its stale file, served by the gateway that woke, is caught too.
    views = {(P, FILE): {"g1": png(A), "g2": png(B), "g3": png(B)}}
    verdict = judge(observed(changes, late, "g2", B, tuple(journal), views=views), 0.0)
    assert verdict.stale_files == 1
    assert any(f"{FILE} on g1 serves g1#1's file" in p for p in verdict.problems)


def test_work_done_before_a_store_outage_and_run_again_is_run_twice() -> None:
    # g1 finished its side effect, could not record the end while the store was away,
    # and the prompt ran again: g1 was never killed or paused, so nothing excuses it.
    seen = observed(
        [
            change("running", 1, 1.0, "g1", "local"),
            change("pending", 1, 8.0, None, None),
            change("running", 2, 8.1, "g2", "local"),
            change("success", 2, 9.5, "g2", "local"),
        ],
        [line("g1", 1, 2.0, 101, A), line("g2", 2, 9.0, 102, B)],
        recorder="g2",
        served=B,
    )
    assert figures(judge(seen, 0.0)) == {"ran_twice": 1}


def test_a_backend_run_adopted_by_another_gateway_is_one_run() -> None:
    changes = [
        change("running", 1, 1.0, "g1", "backend:b1"),
        change("running", 2, 5.0, "g2", "backend:b1"),  # g1 died: g2 adopts, follows
        change("success", 2, 6.0, "g2", "backend:b1"),
    ]
    lines = [line("b1", 1, 3.0, 201, A)]
    assert judge(observed(changes, lines, "g2", A), 0.0).failures() == 0
    # A second execution_start for a run that did not start again is a stream error.
    twice = {P: ["execution_start", "execution_start", "execution_success", "done"]}
    assert figures(judge(observed(changes, lines, "g2", A, streams=twice), 0.0)) == {
        "stream_errors": 1
    }


def test_a_backend_running_a_prompt_again_after_its_end_is_fenced_out() -> None:
    changes = [
        change("running", 1, 1.0, "g1", "backend:b1"),
        change("success", 1, 3.0, "g1", "backend:b1"),
    ]
    lines = [line("b1", 1, 2.0, 201, A), line("b1", 2, 9.0, 202, B)]  # after its restart
    journal = (Signalled(5.0, "b1", 201, "SIGKILL"),)
    assert figures(judge(observed(changes, lines, "g1", A, journal), 0.0)) == {
        "ran_twice": 1,
        "fenced_out": 1,
    }


def test_an_acknowledged_prompt_without_history_is_lost() -> None:
    seen = observed(
        [change("running", 1, 1.0, "g1", "local")],
        [],
        recorder="g1",
        served=A,
        histories={g: {} for g in GATEWAYS},
        deliveries=[],
    )
    verdict = judge(seen, 0.0)
    assert verdict.lost == 1 and verdict.failures() == 1


def test_an_end_no_client_asked_for_is_caught() -> None:
    # The prompt's work was done, but its end was recorded as interrupted.
    seen = observed(
        [change("running", 1, 1.0, "g1", "local"), change("interrupted", 1, 2.1, "g1", "local")],
        [line("g1", 1, 2.0, 101, A)],
        recorder="g1",
        served=A,
        jobs={P: {"status": "interrupted", "gateway": "g1"}},
    )
    verdict = judge(seen, 0.0)
    assert (verdict.interrupted, verdict.failures()) == (1, 1)
