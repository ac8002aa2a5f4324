"""The gateway killed while backends run its prompts: after a restart each completes once."""

from __future__ import annotations

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import backend_history, backend_queue, poll, sleep_prompt
from tests.integration.gateway.processes import logged_events

SHORT = 1.0  # ends while the gateway is down: collected from the backend's history
LONG = 5.0  # still running when the gateway is back: followed to its end there


def test_gateway_kill_and_restart_completes_every_job_exactly_once(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=4)
    running = [
        fleet.submit(sleep_prompt(seconds, color))
        for color, seconds in enumerate((SHORT, SHORT, LONG, LONG))
    ]
    on = {prompt_id: fleet.wait_running_on_backend(prompt_id) for prompt_id in running}
    assert sorted(on.values()) == sorted(fleet.backends)  # one per backend
    queued = [fleet.submit(sleep_prompt(0.2, 10 + i)) for i in range(4)]
    assert {fleet.job(p)["status"] for p in queued} == {"pending"}

    fleet.restart_gateway(kill=True)
    # The long prompts are still running on their backends now.
    still = [p for p in running[2:] if p in backend_queue(fleet.backends[on[p]])[0]]
    assert still, "the gateway came back too late to re-attach to a running prompt"

    ids = running + queued
    poll(
        lambda: all(fleet.job(p)["status"] == "completed" for p in ids),
        what="every job to complete",
        timeout=40,
    )
    for prompt_id in running:
        job = fleet.job(prompt_id)
        assert (job["attempt"], job["lane"]) == (1, f"backend:{on[prompt_id]}")
        # One stream per prompt, across the restart: its start once, its end once.
        events = logged_events(fleet.gateway.url, prompt_id)
        assert events.count("execution_start") == 1, (prompt_id, events)
        assert events.count("execution_success") == 1, (prompt_id, events)

    history = fleet.history()  # fails on a repeated key
    assert set(ids) <= set(history)
    assert {history[p]["status"]["status_str"] for p in ids} == {"success"}
    for prompt_id in ids:
        ran_it = [
            name
            for name, backend in fleet.backends.items()
            if backend_history(backend, prompt_id) is not None
        ]
        assert ran_it == [fleet.lane_of(prompt_id)], (prompt_id, ran_it)
