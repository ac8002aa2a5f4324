"""One managed backend process, kept running: started, watched, restarted, recycled.

The process is a backend of the fleet like any other (its lane connects, routes and
follows prompts); this keeps the process itself going. While it starts, warms up or
waits to be recycled, its lane is held: it takes no new work. A process that exits or
stops answering is started again after a backoff (1 s, doubling to 60 s; back to 1 s
once one has run a minute); its lane gives the prompt it ran back to the queue, as for
any backend that goes away. One that has taken `max_prompts` prompts, or grown past
`max_rss` once it has run one, is recycled when idle: it never loses a running prompt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import aiohttp

from comfyfleet.folders import UnsafePath, resolve_inside
from comfyfleet.lanes.comfyui import ComfyUILane
from comfyfleet.managed.known import load_known, save_known
from comfyfleet.managed.process import cap_log, exit_reason, rss_bytes, spawn, terminate
from comfyfleet.managed.spec import InstanceSpec

log = logging.getLogger(__name__)

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0
STABLE_AFTER = 60.0  # answering this long: the next failure starts the backoff over
PROBE_EVERY = 1.0  # seconds between looks at a running process
STARTING_PROBE = 0.2  # seconds between looks while it starts
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL


class InstanceState(StrEnum):
    STARTING = "starting"  # started, not answering yet
    WARMING = "warming"  # running its warm-up prompt
    RUNNING = "running"  # takes work
    RECYCLING = "recycling"  # takes no more work; restarted once idle
    BACKOFF = "backoff"  # ended unexpectedly; started again at `next_start`
    STOPPED = "stopped"  # the gateway stopped it (shutdown or removal)


@dataclass(frozen=True)
class Hooks:
    """What an instance needs of the running gateway."""

    session: aiohttp.ClientSession  # for its own probes
    busy: Callable[[str], bool]  # whether the scheduler has prompts running on a lane
    wake: Callable[[], None]  # idle slots look again (a lane's hold changed)
    pack_paths: Path | None = None  # the model-paths file that adds the companion pack


@dataclass(frozen=True)
class Ended:
    """Why a process's run ended, and how long it answered before that."""

    reason: str
    recycle: bool = False
    answered_for: float = 0.0
    grace: float = STOP_GRACE  # for a SIGTERM: none for one that no longer answers


class ManagedInstance:
    def __init__(self, spec: InstanceSpec, lane: ComfyUILane) -> None:
        self.spec = spec
        self.lane = lane
        self._hooks: Hooks | None = None
        self.state = InstanceState.STARTING
        self.pid: int | None = None
        self.restarts = 0  # unexpected ends
        self.recycles = 0
        self.last_exit: str | None = None
        self.prompts = 0  # taken by the current process
        self.rss: int | None = None
        self.next_start: float | None = None  # time.time() of the next start, in backoff
        self._proc: asyncio.subprocess.Process | None = None
        self._log_file = spec.log
        self._task: asyncio.Task[None] | None = None
        lane.held = True
        lane.on_sent = self._sent

    @property
    def name(self) -> str:
        return self.spec.name

    def status(self) -> dict[str, Any]:
        """What the admin API shows of it."""
        return {
            "state": self.state.value,
            "pid": self.pid,
            "gpu": self.spec.gpu,
            "port": self.spec.port,
            "restarts": self.restarts,
            "recycles": self.recycles,
            "last_exit": self.last_exit,
            "prompts": self.prompts,
            "rss_bytes": self.rss,
            "next_start": self.next_start,
            "log": str(self.spec.log),
        }

    async def recall(self) -> None:
        """What it offered when it last ran, until it answers (see `known`)."""
        known = await asyncio.to_thread(load_known, self.spec.folder)
        if known is not None and not self.lane.capabilities.object_info:
            self.lane.capabilities = known

    async def start(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._task = asyncio.create_task(self._supervise(), name=f"managed-{self.name}")

    async def stop(self) -> None:
        """Stop watching it, then stop the process (SIGTERM, SIGKILL after a grace)."""
        self.lane.held = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._proc is not None:
            await terminate(self._proc, STOP_GRACE)
            self._proc = None
        self.state, self.pid, self.next_start = InstanceState.STOPPED, None, None

    def _sent(self) -> None:
        self.prompts += 1
        limit = self.spec.group.max_prompts
        if limit is not None and self.prompts >= limit:
            self.lane.held = True  # at once: no slot takes another before the recycle

    async def _supervise(self) -> None:
        delay = FIRST_BACKOFF
        while True:
            try:
                ended = await self._run_once()
            except Exception as exc:  # never lose the process to a bug here: restart it
                log.exception("managed backend %s: supervision failed", self.name)
                ended = Ended(f"supervision failed: {exc}")
            if self._proc is not None:
                await terminate(self._proc, ended.grace)
                self._proc = None
            self.pid, self.last_exit = None, ended.reason
            if ended.recycle:
                self.recycles += 1
                log.info("managed backend %s recycled: %s", self.name, ended.reason)
                continue
            if ended.answered_for >= STABLE_AFTER:
                delay = FIRST_BACKOFF
            self.restarts += 1
            log.warning(
                "managed backend %s %s; starting it again in %.0f s (log: %s)",
                self.name,
                ended.reason,
                delay,
                self.spec.log,
            )
            self.state, self.next_start = InstanceState.BACKOFF, time.time() + delay
            await asyncio.sleep(delay)
            delay = min(MAX_BACKOFF, delay * 2)

    async def _run_once(self) -> Ended:
        """Start the process, and return once it has ended or must be recycled (it may
        still run: the caller stops it)."""
        self.lane.held = True
        self.state, self.next_start, self.prompts, self.rss = InstanceState.STARTING, None, 0, None
        spec, hooks = self.spec, self._checked_hooks()
        started = time.monotonic()
        try:
            self._log_file = await asyncio.to_thread(_make_folders, spec.folder)
            argv = spec.argv(hooks.pack_paths)
            self._proc = await spawn(argv, spec.environment(os.environ), spec.cwd, self._log_file)
        except (OSError, UnsafePath) as exc:
            return Ended(f"could not start: {exc}")
        self.pid = self._proc.pid
        log.info("managed backend %s started: pid %d, %s", self.name, self.pid, spec.url)
        exited = asyncio.ensure_future(self._proc.wait())
        try:
            failed = await self._until_answering(exited, started)
            if failed is None and spec.group.warmup is not None:
                self.state = InstanceState.WARMING
                failed = await self._warm_up(exited, started)
            if failed is not None:
                return Ended(failed)
            self.state = InstanceState.RUNNING
            self.lane.held = False
            hooks.wake()
            return await self._watch(exited, time.monotonic())
        finally:
            exited.cancel()

    def _checked_hooks(self) -> Hooks:
        assert self._hooks is not None, "started without hooks"
        return self._hooks

    async def _until_answering(self, exited: asyncio.Future[int], started: float) -> str | None:
        """None once it answers HTTP (its lane is told to connect now); else why not."""
        while True:
            await asyncio.wait([exited], timeout=STARTING_PROBE)
            if exited.done():
                return exit_reason(exited.result(), time.monotonic() - started)
            if await self._queue_remaining(timeout=5.0) is not None:
                self.lane.retry_now()
                return None
            waited = time.monotonic() - started
            if waited > self.spec.group.start_timeout:
                return f"did not answer within {waited:.0f} s"

    async def _warm_up(self, exited: asyncio.Future[int], started: float) -> str | None:
        """Run the warm-up prompt there (the lane takes no work meanwhile); None when it
        has ended (a failed warm-up is logged, not fatal), else why the process did."""
        prompt_id = str(uuid.uuid4())
        body = {"prompt": self.spec.group.warmup, "prompt_id": prompt_id}
        body["client_id"] = f"comfyfleet-warmup-{self.name}"
        answer = await self._call("POST", "/prompt", body, timeout=60.0)
        if not (isinstance(answer, dict) and answer.get("prompt_id") == prompt_id):
            log.warning("managed backend %s refused its warm-up: %.300s", self.name, answer)
            return None
        while True:
            await asyncio.wait([exited], timeout=0.5)
            if exited.done():
                return exit_reason(exited.result(), time.monotonic() - started)
            entry = await self._call("GET", f"/history/{prompt_id}", None, timeout=10.0)
            if isinstance(entry, dict) and isinstance(entry.get(prompt_id), dict):
                status = entry[prompt_id].get("status")
                outcome = status.get("status_str") if isinstance(status, dict) else None
                log.info("managed backend %s warmed up: %s", self.name, outcome)
                return None
            if time.monotonic() - started > self.spec.group.start_timeout:
                log.warning("managed backend %s: warm-up still running, going on", self.name)
                return None

    async def _watch(self, exited: asyncio.Future[int], since: float) -> Ended:
        """Until it exits, stops answering, or is due for a recycle."""
        group = self.spec.group
        answered = since
        saved = False  # what it offers now, for the next start
        while True:
            await asyncio.wait([exited], timeout=PROBE_EVERY)
            now = time.monotonic()
            if exited.done():
                return Ended(exit_reason(exited.result(), now - since), answered_for=now - since)
            if await self._queue_remaining(timeout=min(10.0, group.health_timeout)) is not None:
                answered = time.monotonic()
            elif now - answered > group.health_timeout:
                silent = f"stopped answering for {now - answered:.0f} s"
                return Ended(silent, answered_for=answered - since, grace=0.0)
            assert self.pid is not None
            self.rss = await asyncio.to_thread(_look_at, self.pid, self._log_file)
            if not saved and self.lane.up:
                saved = True
                await asyncio.to_thread(save_known, self.spec.folder, self.lane.capabilities)
            due = self._recycle_reason()
            if due is not None:
                return await self._recycle(due, exited, since)

    def _recycle_reason(self) -> str | None:
        group = self.spec.group
        if group.max_prompts is not None and self.prompts >= group.max_prompts:
            return f"recycled after {self.prompts} prompts"
        # Only grown by work: one that starts that big would be recycled forever.
        grown = group.max_rss is not None and self.rss is not None and self.rss > group.max_rss
        if grown and self.prompts > 0:
            return f"recycled at {(self.rss or 0) / 2**20:.0f} MiB resident"
        return None

    async def _recycle(self, reason: str, exited: asyncio.Future[int], since: float) -> Ended:
        """Hold the lane, and return once nothing runs there (nor waits in its queue)."""
        self.state = InstanceState.RECYCLING
        self.lane.held = True
        hooks = self._checked_hooks()
        hooks.wake()  # what was set aside for it goes to other lanes
        while True:
            if not hooks.busy(self.lane.name) and not await self._queue_remaining(timeout=10.0):
                return Ended(reason, recycle=True, answered_for=time.monotonic() - since)
            await asyncio.wait([exited], timeout=STARTING_PROBE)
            if exited.done():
                now = time.monotonic()
                return Ended(exit_reason(exited.result(), now - since), answered_for=now - since)

    async def _queue_remaining(self, timeout: float) -> int | None:
        """Its `GET /prompt` queue_remaining; None when it does not answer so."""
        answer = await self._call("GET", "/prompt", None, timeout=timeout)
        info = answer.get("exec_info") if isinstance(answer, dict) else None
        remaining = info.get("queue_remaining") if isinstance(info, dict) else None
        if isinstance(remaining, int) and not isinstance(remaining, bool):
            return remaining
        return None

    async def _call(self, method: str, path: str, body: Any, timeout: float) -> Any:
        """The JSON answer of one request to the process; None for no answer (or not JSON)."""
        try:
            async with self._checked_hooks().session.request(
                method,
                self.spec.url + path,
                json=body,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                if response.status != 200:
                    return None
                if (response.content_length or 0) > 16 * 1024 * 1024:
                    return None  # no answer to these is anywhere near that big
                return await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None


def _make_folders(folder: Path) -> Path:
    """Its input, output and temp folders; the path of its log (a link there may not
    lead out of its folder)."""
    for sub in ("input", "output", "temp"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return resolve_inside(folder, "process.log")


def _look_at(pid: int, log_file: Path) -> int | None:
    """Its resident memory; and its log kept under the cap meanwhile."""
    cap_log(log_file)
    return rss_bytes(pid)
