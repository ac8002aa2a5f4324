"""`--log-format json`: the setting, and what each line holds (records made by the real
logging machinery; the server's own lines: tests/integration/gateway/test_json_logs.py)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from comfyfleet.domain.jobs import NewJob
from comfyfleet.logs import JobTagFilter, JsonFormatter, tag_job
from comfyfleet.server.config import ConfigError, load_config


def test_the_format_comes_from_the_file_the_variable_or_the_flag(tmp_path: Path) -> None:
    assert load_config(env={}).log_format == "text"
    config_file = tmp_path / "server.toml"
    config_file.write_text('log_format = "json"\n', encoding="utf-8")
    assert load_config(config_file, env={}).log_format == "json"
    assert load_config(env={"COMFYFLEET_LOG_FORMAT": "json"}).log_format == "json"
    flags = {"log_format": "text"}
    assert load_config(config_file, env={}, overrides=flags).log_format == "text"
    with pytest.raises(ConfigError, match="log_format must be text or json"):
        load_config(env={"COMFYFLEET_LOG_FORMAT": "xml"})


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """JSON lines of the `test.joblog` logger, with "s3cret" redacted."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(lambda text: text.replace("s3cret", "***")))
    handler.addFilter(JobTagFilter())
    logger = logging.getLogger("test.joblog")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_lines_inside_an_attempt_carry_the_job_also_from_threads(
    captured: io.StringIO,
) -> None:
    log = logging.getLogger("test.joblog")
    queued = NewJob("p1", 1, False, {}, {}, [], tenant="alice").pending(1, 0.0)
    job = replace(queued, lane="local", attempt=2)

    async def attempt() -> None:
        tag_job(job)
        log.info("in the task")
        await asyncio.to_thread(log.warning, "in a thread\nsecond line")

    await asyncio.create_task(attempt())
    log.info("outside, token s3cret")
    try:
        raise ValueError("bad s3cret")
    except ValueError:
        log.exception("failed")
    inside, threaded, outside, failed = lines(captured)
    tag = {"prompt_id": "p1", "tenant": "alice", "lane": "local", "attempt": 2}
    assert {k: inside[k] for k in tag} == tag and inside["message"] == "in the task"
    assert {k: threaded[k] for k in tag} == tag and threaded["level"] == "WARNING"
    assert threaded["message"] == "in a thread\nsecond line"
    assert "prompt_id" not in outside and outside["message"] == "outside, token ***"
    assert outside["logger"] == "test.joblog" and str(outside["time"]).endswith("Z")
    assert "ValueError: bad ***" in str(failed["exception"])
    assert "s3cret" not in captured.getvalue()
