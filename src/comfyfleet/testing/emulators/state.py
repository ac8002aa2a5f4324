"""The emulator's dials, its jobs, and the counters tests read back."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.testing.emulators.png import render_png


@dataclass
class EmulatorSettings:
    """Read on every request, so a test may change any field while the emulator runs."""

    latency: float = 2.0  # seconds a job takes (BFL) or a request is held (OpenAI)
    jitter: float = 0.5  # +- uniform spread around latency
    fail_rate: float = 0.0  # job-creating requests refused with a 500
    error_rate: float = 0.0  # accepted BFL jobs that end with status "Error"
    rate_limit: float | None = None  # job-creating requests per second per key
    max_active: int | None = None  # BFL: pending jobs per key before 429
    retry_after: float | None = None  # Retry-After to send; None: time until a slot frees
    send_retry_after: bool = True
    # Requests of any kind (job creation, polls, downloads) answered 429 at random,
    # with Retry-After `retry_after` (or 1 s): a busy account or a strict gateway.
    throttle_rate: float = 0.0
    hang_rate: float = 0.0  # job-creating requests accepted and never answered
    moderation_rate: float = 0.0
    keys: list[str] = field(default_factory=list)  # empty: any key is accepted
    sample_ttl: float = 600.0  # seconds a result URL stays valid
    seed: int | None = None  # seeds the dice, for reproducible runs
    # Deterministic counterparts of the rates, counted down by the emulator.
    fail_next: int = 0
    fail_next_polls: int = 0
    throttle_next_polls: int = 0  # polls answered 429
    hang_next: int = 0


@dataclass
class Task:
    id: str
    key: str
    model: str
    ready_at: float
    duration: float
    outcome: str  # "Ready", "Content Moderated" or "Error"
    size: tuple[int, int]
    rgb: tuple[int, int, int]
    cancelled: bool = False
    file: str | None = None  # set when the result is first reported
    png: asyncio.Future[bytes] | None = None  # made while the job runs


@dataclass
class VideoJob:
    """An emulated OpenAI video job; `outcome` is "completed" or an error code."""

    id: str
    key: str
    model: str
    created_at: int
    ready_at: float
    duration: float
    outcome: str
    size: tuple[int, int]
    seconds: int
    rgb: tuple[int, int, int]
    deleted: bool = False
    cancelled: bool = False  # deleted before it was done


@dataclass
class ImageFile:
    size: tuple[int, int]
    rgb: tuple[int, int, int]
    expires_at: float
    png: asyncio.Future[bytes]


def key_label(key: str | None) -> str:
    """How a key appears in stats: a short hash, never the key itself."""
    if not key:
        return "anonymous"
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:10]


def body_hash(kind: str, body: Any) -> str:
    canonical = json.dumps([kind, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class EmulatorState:
    def __init__(self, settings: EmulatorSettings) -> None:
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.stopping = asyncio.Event()
        self._renders: set[asyncio.Future[bytes]] = set()
        self.clock = time.monotonic
        self.reset()

    def reset(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.videos: dict[str, VideoJob] = {}
        self.files: dict[str, ImageFile] = {}
        self.jobs_by_key: Counter[str] = Counter()
        self.jobs_by_model: Counter[str] = Counter()
        self.body_hashes: Counter[str] = Counter()
        self.idempotency_keys: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        # (monotonic time, path, status) of every job-creating request, for timing tests.
        self.create_log: list[tuple[float, str, int]] = []
        self._windows: dict[str, deque[float]] = {}

    def chance(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate

    def take(self, counter: str) -> bool:
        """Consume one of the `fail_next`-style countdowns in the settings."""
        left: int = getattr(self.settings, counter)
        if left > 0:
            setattr(self.settings, counter, left - 1)
            return True
        return False

    def duration(self) -> float:
        spread = self.rng.uniform(-self.settings.jitter, self.settings.jitter)
        return max(0.0, self.settings.latency + spread)

    def rate_limited(self, label: str) -> float | None:
        """Seconds until `label` may create another job, or None when it may now."""
        limit = self.settings.rate_limit
        if limit is not None and limit > 0:
            window = max(1.0, 1.0 / limit)
            allowed = max(1, round(limit * window))
            now = self.clock()
            recent = self._windows.setdefault(label, deque())
            while recent and recent[0] <= now - window:
                recent.popleft()
            if len(recent) >= allowed:
                return recent[0] + window - now
            recent.append(now)
        return self._active_wait(label)

    def _active_wait(self, label: str) -> float | None:
        if self.settings.max_active is None:
            return None
        now = self.clock()
        pending = sorted(
            t.ready_at
            for t in self.tasks.values()
            if t.key == label and not t.cancelled and t.ready_at > now
        )
        if len(pending) < self.settings.max_active:
            return None
        return pending[0] - now

    def retry_after(self, wait: float) -> str:
        value = self.settings.retry_after
        seconds = max(1, math.ceil(wait)) if value is None else value
        return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:.3f}"

    def count_job(self, label: str, model: str, digest: str) -> None:
        self.counts["jobs"] += 1
        self.jobs_by_key[label] += 1
        self.jobs_by_model[model] += 1
        self.body_hashes[digest] += 1

    def render(
        self, size: tuple[int, int], rgb: tuple[int, int, int], after: float = 0.0
    ) -> asyncio.Future[bytes]:
        """The PNG, made in a worker thread `after` seconds from now.

        A provider makes its file while the job runs, so a download is a transfer,
        not a wait for rendering; half-way through a job is when the emulator has
        least else to do (job creation and downloads bunch at the ends).
        """

        async def rendered() -> bytes:
            await asyncio.sleep(after)
            return await asyncio.to_thread(render_png, *size, rgb)

        future = asyncio.ensure_future(rendered())
        self._renders.add(future)
        future.add_done_callback(self._renders.discard)
        return future

    def stop(self) -> None:
        """Release held requests and drop renders not begun (the server is stopping)."""
        self.stopping.set()
        for future in list(self._renders):
            future.cancel()

    def add_file(
        self,
        size: tuple[int, int],
        rgb: tuple[int, int, int],
        png: asyncio.Future[bytes] | None = None,
    ) -> str:
        name = uuid.uuid4().hex
        expires_at = self.clock() + self.settings.sample_ttl
        self.files[name] = ImageFile(size, rgb, expires_at, png or self.render(size, rgb))
        return name

    def stats(self) -> dict[str, Any]:
        return {
            "jobs": self.counts["jobs"],
            "jobs_by_key": dict(self.jobs_by_key),
            "jobs_by_model": dict(self.jobs_by_model),
            "body_hashes": dict(self.body_hashes),
            "duplicates": sum(n - 1 for n in self.body_hashes.values() if n > 1),
            "idempotency_keys": dict(self.idempotency_keys),
            "create_requests": self.counts["create_requests"],
            "rate_limited": self.counts["rate_limited"],
            "reads_rate_limited": self.counts["reads_rate_limited"],
            "failed": self.counts["failed"],
            "hung": self.counts["hung"],
            "moderated": self.counts["moderated"],
            "polls": self.counts["polls"],
            "cancels": self.counts["cancels"],
            "cancelled": sum(1 for t in self.tasks.values() if t.cancelled)
            + sum(1 for v in self.videos.values() if v.cancelled),
            "downloads": self.counts["downloads"],
            "unauthorized": self.counts["unauthorized"],
        }
