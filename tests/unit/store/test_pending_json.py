"""Pending jobs' decoded JSON is kept while they wait, never served for other text,
forgotten once the job runs, and bounded."""

from __future__ import annotations

import json

from comfyfleet.store.pending_json import PendingJson


def texts(prompt: dict[str, object]) -> tuple[str, str, str]:
    return json.dumps(prompt), "{}", '["1"]'


def test_a_pending_jobs_json_is_decoded_once_while_its_text_is_the_same() -> None:
    pending = PendingJson()
    first = pending.decode("p", texts({"1": {"class_type": "A"}}))
    assert first == ({"1": {"class_type": "A"}}, {}, ["1"])
    assert pending.decode("p", texts({"1": {"class_type": "A"}}))[0] is first[0]
    changed = pending.decode("p", texts({"1": {"class_type": "B"}}))
    assert changed[0] == {"1": {"class_type": "B"}}


def test_a_taken_job_is_decoded_afresh_and_the_oldest_are_dropped() -> None:
    pending = PendingJson(kept=2)
    first = pending.decode("p", texts({}))
    pending.taken("p")
    assert pending.decode("p", texts({}))[0] is not first[0]
    kept = pending.decode("q", texts({}))
    pending.decode("r", texts({}))
    pending.decode("s", texts({}))  # "p" and "q" go: two are kept
    assert pending.decode("q", texts({}))[0] is not kept[0]
