"""Log output: text lines, or one JSON object per line (`--log-format json`).

While a job's attempt runs, `JOB` holds which job it is (`tag_job`, set by the
scheduler in the attempt's task), so every line logged inside the attempt by the
scheduler, the lane, the engine or node code on its threads carries the job's
prompt_id, tenant, lane and attempt. A `job_tag` passed in a record's `extra` wins.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from comfyfleet.domain.jobs import Job

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True)
class JobTag:
    """What a log line says about the job it concerns."""

    prompt_id: str
    tenant: str
    lane: str | None
    attempt: int

    @classmethod
    def of(cls, job: Job) -> JobTag:
        return cls(job.prompt_id, job.tenant, job.lane, job.attempt)


#: The job whose attempt the current task (or thread it started) works for.
JOB: ContextVar[JobTag | None] = ContextVar("comfyfleet_job", default=None)


def tag_job(job: Job) -> None:
    """Tag every line logged from here on in this task (and what it starts) with `job`.
    Call it at the start of a task of its own: the tag ends with the task."""
    JOB.set(JobTag.of(job))


class JobTagFilter(logging.Filter):
    """Stamps the current job's tag on each record, in the thread that logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job_tag", None) is None:
            record.job_tag = JOB.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, the
    exception's text if any, and the job's fields when the line concerns one. Message and
    exception text pass through `redact` (secrets become `***`)."""

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.redact: Callable[[str], str] = redact or (lambda text: text)

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, object] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": self.redact(record.getMessage()),
        }
        if record.exc_info:
            line["exception"] = self.redact(self.formatException(record.exc_info))
        if record.stack_info:
            line["stack"] = self.redact(self.formatStack(record.stack_info))
        tag = getattr(record, "job_tag", None)
        if isinstance(tag, JobTag):
            line.update(asdict(tag))
        # ASCII: a lone surrogate in a message cannot break the line's encoding.
        return json.dumps(line, ensure_ascii=True, default=str)


def configure(log_format: str, level: str) -> logging.Formatter:
    """Send the process's logs to stderr as `log_format` says; returns the formatter (the
    JSON one takes its redaction once the secrets are known)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler()
    formatter: logging.Formatter
    if log_format == "json":
        formatter = JsonFormatter()
        handler.addFilter(JobTagFilter())
        logging.captureWarnings(True)  # warnings become records: every line stays JSON
    else:
        formatter = logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    return formatter
