"""Label values from anywhere come out of the text format intact (or made safe), and a
label whose values grow with use keeps a bounded number of series."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.server.admin.metrics.jobs import MAX_LANES, JobMetrics
from comfyfleet.server.admin.metrics.labels import MAX_LENGTH, OTHER, BoundedLabel, clean

HOSTILE = [
    'quote " and backslash \\ and newline \n end',
    "} 1\n# TYPE evil counter\nevil_total 1",
    "\u2028 line separator, \U0001f600 emoji, NUL \x00",
    "x" * 1000,
    "lone surrogate \ud800 here",
]


def parsed(registry: CollectorRegistry) -> list[dict[str, str]]:
    text = generate_latest(registry).decode("utf-8")
    families = list(text_string_to_metric_families(text))
    # Nothing injected (`_created` series come unless a gateway turned them off).
    assert {f.name for f in families} <= {"hostile", "hostile_created"}
    return [s.labels for f in families for s in f.samples if s.name == "hostile_total"]


def test_hostile_values_come_back_as_they_went_in_or_made_safe() -> None:
    registry = CollectorRegistry()
    counter = Counter("hostile", "Values from outside.", ["value"], registry=registry)
    label = BoundedLabel(limit=100)
    for value in HOSTILE:
        counter.labels(label(value)).inc()
    back = {labels["value"] for labels in parsed(registry)}
    assert back == {clean(value) for value in HOSTILE}
    assert HOSTILE[0] in back and HOSTILE[1] in back and HOSTILE[2] in back
    assert "x" * MAX_LENGTH in back  # cut
    assert "lone surrogate ? here" in back  # not UTF-8: replaced


def test_values_past_the_limit_are_counted_as_other() -> None:
    registry = CollectorRegistry()
    counter = Counter("hostile", "Values from outside.", ["value"], registry=registry)
    label = BoundedLabel(limit=3)
    for n in range(10):
        counter.labels(label(f"v{n}")).inc()
    counter.labels(label("v1")).inc()  # one seen before keeps its own series
    counts = {s.labels["value"]: s.value for s in _samples(registry)}
    assert counts == {"v0": 1, "v1": 2, "v2": 1, OTHER: 7}


def _samples(registry: CollectorRegistry) -> list[Sample]:
    text = generate_latest(registry).decode("utf-8")
    return [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.endswith("_total")
    ]


def _job(prompt_id: str, lane: str) -> Job:
    now = time.time()
    return Job(
        prompt_id, 0, False, 1, {}, {}, [], None, JobStatus.RUNNING, 1, lane, now, started_at=now
    )


def test_lanes_that_come_and_go_keep_the_answer_bounded() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    result = JobResult(JobStatus.SUCCESS, {}, {}, [])
    for n in range(MAX_LANES + 50):
        job = _job(f"p{n}", f"backend:b{n}")
        metrics.job_started(job)
        metrics.job_finished(job, result)
    text = generate_latest(registry).decode("utf-8")
    lanes = {
        s.labels["lane"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "comfyfleet_job_attempts_total"
    }
    assert len(lanes) == MAX_LANES + 1 and OTHER in lanes
