"""A ComfyUI lane: jobs run on one ComfyUI backend (a real ComfyUI or another comfyfleet)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp

from comfyfleet.domain.budgets import ALLOWANCE_KEY
from comfyfleet.domain.jobs import HOLD_KEY, HOLDS_ROUTE, PACK_ROUTE, Job, JobResult, pack_features
from comfyfleet.domain.webhooks import EVENTS_KEY, URL_KEY
from comfyfleet.engine.events import EventSink
from comfyfleet.engine.services import Services
from comfyfleet.errors import ComfyfleetError
from comfyfleet.folders import Folders
from comfyfleet.lanes.backend import (
    MAX_FILE_BYTES,
    BackendAnswered,
    BackendClient,
    BackendError,
    BackendSpec,
    FileAnswer,
    PromptWatch,
    Withdrawn,
    WorkerLink,
)
from comfyfleet.lanes.base import Adopt, LaneRun, adopt_none
from comfyfleet.lanes.capabilities import Capabilities, Key, KnownCapabilities
from comfyfleet.lanes.endings import (
    foreign_file_answer,
    refused_result,
    withdrawn_result,
)
from comfyfleet.lanes.following import BackendState, PromptFollower
from comfyfleet.lanes.outputs import (
    OutputCopier,
    OutputReferencer,
)
from comfyfleet.lanes.settings import LaneSettings
from comfyfleet.lanes.submits import Submits
from comfyfleet.lanes.uploads import FetchInputs, ForeignFile, InputPusher
from comfyfleet.nodes.core.saving import SHARED_COUNTERS
from comfyfleet.spend.holds import BackendHolds
from comfyfleet.tenants import TenantFolders

log = logging.getLogger(__name__)


#: The companion pack's routes (comfyfleet.comfyui_pack; comfyfleet serves them too).
VALIDATE_ROUTE = "/comfyfleet/validate"
#: extra_data keys a backend is not sent: this gateway routes events and sends webhooks.
BACKEND_DROPS = frozenset({"client_id", URL_KEY, EVENTS_KEY})


class PromptRefused(ComfyfleetError):
    """The backend answered 400 to the prompt: its validation refused it (or the id)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(str(answer.get("error")))
        self.answer = answer

    @property
    def duplicate(self) -> bool:
        return bool(self.answer["error"].get("type") == "duplicate_prompt_id")


class ComfyUILane:
    """Runs jobs on a backend; `slots` = the backend's slots plus its prefetch depth."""

    in_process = False
    retry_node_errors = True

    def __init__(
        self,
        client: BackendClient,
        folders: Folders,
        settings: LaneSettings,
        tenants: TenantFolders | None = None,
        submits: Submits | None = None,
        fetch_inputs: FetchInputs | None = None,
    ) -> None:
        self.client = client
        self.folders = folders
        self.tenants = tenants  # each job's files live in its tenant's folders
        self.settings = settings
        self.name = f"backend:{client.spec.name}"
        self.slots = client.spec.slots + client.spec.prefetch
        self.runs_at_once = client.spec.slots
        self.capabilities = Capabilities()
        self._capabilities_key: Key | None = None  # what they were read from
        # Where lanes of one fleet share what their backends can run (see `_refresh`).
        self.known = KnownCapabilities()
        # The process's services (engine/services.py): the store's file counters, with
        # gateways sharing a store, name the copies of its outputs.
        self.services = Services()
        self.validates = False  # it has the companion pack: `validate` asks it
        self.state = BackendState()  # holds, refused, suspect: what following depends on
        self.draining = False
        # Its process is (re)starting, warming up or about to be recycled (a managed
        # backend): no new work, whatever an admin's drain or resume says.
        self.held = False
        self._retry = asyncio.Event()  # `retry_now`: connect without waiting out the backoff
        self._pusher = InputPusher(
            client, folders, lambda: self.capabilities.object_info, fetch_inputs
        )
        self._maintainer: asyncio.Task[None] | None = None
        self._observer: asyncio.Task[None] | None = None  # see `observe`
        # Connected, and what an earlier connection left there sorted out: takes work.
        self.ready = asyncio.Event()
        self._adopt: Adopt = adopt_none
        self.submits = submits or Submits()  # shared by the lanes of one fleet
        self.follower = PromptFollower(client, settings, self.state, self.submits, self._outputs)
        # Called when capabilities change (the fleet rebuilds its node union), and as
        # the backend accepts each prompt (a managed backend counts them).
        self.on_change: Callable[[], Awaitable[None]] = _nothing
        self.on_sent: Callable[[], None] = _ignore
        self.only_tenant: str | None = None  # see Lane
        self.worker: WorkerLink | None = None  # a worker's lane: its connection
        # Budget holds of the prompts it runs (the fleet's, when budgets apply).
        self.holds = BackendHolds(None, client.spec.name, self.fetch_json)

    @property
    def suspect(self) -> bool:
        return time.monotonic() < self.state.suspect_until

    def can_run(self, job: Job) -> bool:
        # Runs in the store's writer thread: reads a few fields, changes nothing.
        mine = self.only_tenant is None or job.tenant == self.only_tenant
        return (
            mine
            and self.up
            and not (self.draining or self.held or self.suspect)
            and (self.capabilities.can_run(job.prompt))
        )

    @property
    def client_id(self) -> str:
        """The id it connects with (the backend sends its prompts' frames to it)."""
        return self.client.client_id

    def connect_as(self, client_id: str) -> None:
        """Connect (from the next connection on) with `client_id`: the fleet's one id for
        this backend, so prompts another gateway queued there send their frames here."""
        self.client.client_id = client_id

    @property
    def spec(self) -> BackendSpec:
        return self.client.spec

    @property
    def connected(self) -> bool:
        """Its WebSocket is open (it may still be sorting out an earlier connection)."""
        return self.client.connected.is_set()

    async def fetch_json(self, path: str, timeout: float = 30.0) -> Any:
        """A GET of one of the backend's JSON routes; BackendError when it fails."""
        return await self.client.request("GET", path, timeout=timeout)

    async def read_file(
        self,
        path: str,
        params: dict[str, str] | None = None,
        *,
        max_bytes: int = MAX_FILE_BYTES,
        timeout: float = 120.0,
    ) -> FileAnswer:
        """A file the backend serves (`BackendClient.read_file`)."""
        return await self.client.read_file(path, params, max_bytes=max_bytes, timeout=timeout)

    @property
    def up(self) -> bool:
        """Connected and sorted out (see `_reconcile`): it takes work."""
        return self.ready.is_set() and self.client.connected.is_set()

    async def wait_ready(self) -> None:
        await self.ready.wait()

    async def run(self, job: Job, sink: EventSink, handle: LaneRun) -> JobResult:
        if not self.up:
            raise BackendError(f"backend {self.client.spec.name} is down")
        watch = self.client.watch(job.prompt_id, on_end=handle.release)
        try:
            ended = await self._send(job, watch, sink, handle)
            if ended is not None:
                return ended
            handle.accept()
            handle.on_interrupt(lambda: self.follower.interrupt_soon(watch))
            handle.offer_back(lambda: self.follower.withdraw(watch), lambda: not watch.started)
            result = await self.follower.follow(job, watch, sink, handle)
            await self.holds.ended(job)
            return result
        except Withdrawn:
            handle.withdrawn = True
            return withdrawn_result(job)
        finally:
            self.holds.forget(job.prompt_id)
            self.client.unwatch(job.prompt_id)

    async def _send(
        self, job: Job, watch: PromptWatch, sink: EventSink, handle: LaneRun
    ) -> JobResult | None:
        """Submit the job's prompt, its files pushed first; None once the backend queued
        it, else how the run ended without that (refused, or known there already)."""
        if job.attempt > 1:
            # An earlier attempt may have reached it (and ended there) unbeknown.
            known = await self.follower.rejoin(job, watch, sink, handle, successes_only=True)
            if known is not None:
                return known
        try:
            prompt = await self._pusher.push_for(job.prompt, self._folders(job), job.tenant)
            try:
                await self._submit(replace(job, prompt=prompt))
            except BackendError as exc:
                if not (self.state.holds and _maybe_taken(exc)):
                    raise
                # It may hold it, unanswered: asked once reached, else lost past its hold.
                watch.lost = True
            watch.kept_at = time.monotonic()  # it holds the prompt from its answer on
        except ForeignFile as foreign:
            return refused_result(job, foreign_file_answer(job.prompt, foreign))
        except PromptRefused as refused:
            if not refused.duplicate:
                return refused_result(job, refused.answer)
            # A backend that keeps ids (another comfyfleet) has it from before.
            known = await self.follower.rejoin(job, watch, sink, handle, successes_only=True)
            if known is None:
                raise BackendError(
                    f"{self.client.spec.name} holds {job.prompt_id} but cannot run it again"
                ) from refused
            return known
        return None

    async def resume(self, job: Job, sink: EventSink, handle: LaneRun) -> JobResult | None:
        """A job this lane ran before a gateway restart: its result, or None if unknown there."""
        await asyncio.wait_for(self.client.connected.wait(), timeout=30.0)
        watch = self.client.watch(job.prompt_id, on_end=handle.release)
        try:
            result = await self.follower.rejoin(job, watch, sink, handle)
            if result is not None:
                await self.holds.ended(job, resumed=True)
            return result
        except Withdrawn:
            handle.withdrawn = True
            return withdrawn_result(job)
        finally:
            self.client.unwatch(job.prompt_id)

    async def start(self, adopt: Adopt = adopt_none) -> None:
        self._adopt = adopt
        self._maintainer = asyncio.create_task(self._maintain(), name=f"{self.name}-health")

    def observe(self) -> None:
        """Keep what it can run known, without connecting to it: another gateway owns it
        (dispatches to it), and this one still validates and accepts prompts for it."""
        if self._observer is None:
            self._observer = asyncio.create_task(self._observe(), name=f"{self.name}-observe")

    async def stop_observing(self) -> None:
        if self._observer is not None:
            self._observer.cancel()
            await asyncio.gather(self._observer, return_exceptions=True)
            self._observer = None

    async def _observe(self) -> None:
        backoff = 0.5
        while True:
            try:
                if await self._refresh():
                    await self.on_change()
                wait, backoff = self.settings.refresh_interval, 0.5
            except BackendError as exc:
                log.debug("backend %s unavailable: %s", self.client.spec.name, exc)
                wait, backoff = backoff, min(self.settings.max_backoff, backoff * 2)
            await asyncio.sleep(wait)

    async def close(self) -> None:
        await self.stop_observing()
        if self._maintainer is not None:
            self._maintainer.cancel()
            await asyncio.gather(self._maintainer, return_exceptions=True)
            self._maintainer = None
        self.ready.clear()  # started again later (its owner again), it sorts things out anew
        await self.client.close()

    def retry_now(self) -> None:
        """The backend answers again (its process was started anew): connect now."""
        self._retry.set()

    async def _maintain(self) -> None:
        """Connect, keep capabilities fresh, and reconnect with backoff when it goes down."""
        backoff = 0.5
        while True:
            self._retry.clear()  # a `retry_now` from here on cuts the wait below short
            try:
                await self._connect_and_refresh()
                self.state.refused = False
                backoff = 0.5
                await self._watch_health()
            except BackendError as exc:
                self.state.refused = _refused(exc)
                # A held backend's process is starting or stopping: that is expected.
                level = logging.DEBUG if self.held else logging.INFO
                log.log(level, "backend %s unavailable: %s", self.client.spec.name, exc)
            self.ready.clear()
            await self.client.close()
            try:
                await asyncio.wait_for(self._retry.wait(), backoff)
                backoff = 0.5
            except TimeoutError:
                backoff = min(self.settings.max_backoff, backoff * 2)

    async def _connect_and_refresh(self) -> None:
        if await self._refresh():
            await self.on_change()  # the node union knows it before it takes work
        await self.client.connect()
        await self._reconcile()
        self.ready.set()
        info = self.capabilities.object_info
        log.info("backend %s up: %d node classes", self.client.spec.name, len(info))

    async def _reconcile(self) -> None:
        """Before new work: what this gateway left on the backend either stays (the
        scheduler follows it as the job's attempt) or goes, so nothing runs twice."""
        running, pending = await self.client.queue_ids(mine=True)
        if not running | pending:
            return
        try:
            keep = await self._adopt(sorted(running | pending))
        except Exception as exc:  # the store refused (a full disk, say): try again later
            raise BackendError(f"could not sort out what it holds: {exc}") from exc
        if self.state.holds and keep:
            await self._keep(sorted(keep))  # before the rest goes: it may run them again
        stale = sorted((running | pending) - keep)
        for prompt_id in stale:
            if prompt_id in pending:
                await self.client.delete_pending(prompt_id)
            else:
                await self.client.interrupt(prompt_id)
        if stale:
            log.info(
                "backend %s: withdrew %d prompts run elsewhere", self.client.spec.name, len(stale)
            )

    async def validate(
        self, prompt: dict[str, Any], targets: list[str] | None, folders: Folders, tenant: str
    ) -> tuple[bool, dict[str, Any]] | None:
        """The backend's own verdict on `prompt`, as its `POST /prompt` would give it:
        (True, {outputs, node_errors}) or (False, {error, node_errors}); None when it
        cannot say (no companion pack, down, or an answer out of protocol). The files
        the prompt names (of `tenant`, in `folders`) are pushed there first, as for a run."""
        if not (self.validates and (self.up or self._observer is not None)):
            return None
        try:
            prompt = await self._pusher.push_for(prompt, folders, tenant)
        except ForeignFile as foreign:
            return False, foreign_file_answer(prompt, foreign)
        except BackendError as exc:
            log.info("backend %s could not take the files: %s", self.client.spec.name, exc)
            return None
        body: dict[str, Any] = {"prompt": prompt}
        if targets is not None:
            body["partial_execution_targets"] = targets
        try:
            status, answer = await self.client.post_json(VALIDATE_ROUTE, body)
        except BackendError as exc:
            log.info("backend %s could not validate: %s", self.client.spec.name, exc)
            return None
        if not isinstance(answer, dict) or not isinstance(answer.get("node_errors"), dict):
            return None
        if status == 200 and isinstance(answer.get("outputs"), list):
            return True, answer
        if status == 400 and isinstance(answer.get("error"), dict):
            return False, answer
        return None

    async def _refresh(self) -> bool:
        """Read what the backend can run: its nodes, the files of its model folders, and
        whether it has the companion pack (it then validates prompts for the gateway).
        Whether its nodes or files changed (the fleet's node union is built anew then)."""
        self.validates, self.state.holds = await ask_pack(self.client)
        object_info = await self.client.json_bytes("/object_info", timeout=60.0)
        models = await self.client.model_files()
        key = KnownCapabilities.key(object_info, models)
        if key == self._capabilities_key:
            return False
        try:
            self.capabilities = await self.known.of(key, object_info, models)
        except (ValueError, RecursionError) as exc:
            raise BackendError(f"GET /object_info: {type(exc).__name__}: {exc}") from exc
        self._capabilities_key = key
        return True

    async def _watch_health(self) -> None:
        """Return when the backend stops answering (HTTP or WebSocket)."""
        refreshed = time.monotonic()
        while self.client.connected.is_set():
            # The next probe, or at once when the connection drops (reconnecting now). A
            # comfyfleet backend hears from it three times per hold.
            every = self.settings.probe_interval
            if self.state.holds:
                every = min(every, self.settings.hold / 3)
            await _first_set((self._retry, self.client.disconnected), every)
            if self._retry.is_set():  # a new process answers: this connection was the old one's
                self._retry.clear()
                continue
            if not self.client.connected.is_set():
                break
            await self.client.request("GET", "/prompt", timeout=10.0)
            if self.state.holds:
                watched = self.client.watched().items()
                await self._keep(sorted(p for p, watch in watched if not watch.abandoned))
            if time.monotonic() - refreshed > self.settings.refresh_interval:
                if await self._refresh():
                    await self.on_change()
                refreshed = time.monotonic()
        raise BackendError("websocket closed")

    async def _keep(self, prompt_ids: list[str]) -> None:
        """Tell the backend this gateway still wants these prompts (see
        scheduler/holds.py); each watch learns from when it holds them again, and the
        lane since when the backend's process has run without a stop."""
        if not prompt_ids:
            return
        body = {"keep": prompt_ids, "seconds": self.settings.hold}
        status, answer = await self.client.post_json(HOLDS_ROUTE, body)
        if (
            status != 200
            or not isinstance(answer, dict)
            or not isinstance(answer.get("kept"), list)
        ):
            raise BackendError(f"{HOLDS_ROUTE}: HTTP {status}: {str(answer)[:300]}")
        now, watched = time.monotonic(), self.client.watched()
        awake = answer.get("awake")
        if isinstance(awake, int | float) and not isinstance(awake, bool) and awake >= 0:
            self.state.awake_since = now - awake
        for prompt_id in answer["kept"]:
            if isinstance(prompt_id, str) and prompt_id in watched:
                watched[prompt_id].kept_at = now

    async def _submit(self, job: Job) -> None:
        entries: dict[str, Any] = {HOLD_KEY: self.settings.hold} if self.state.holds else {}
        if allowance := await self.holds.allowance(job):
            entries[ALLOWANCE_KEY] = allowance
        with self.submits.sending():
            status, answer = await self.client.submit(backend_body(job, entries))
        if status == 400 and isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            raise PromptRefused(answer)
        if status != 200:
            raise BackendAnswered(f"backend {self.client.spec.name} refused the prompt: {answer}")
        self.on_sent()

    def _folders(self, job: Job) -> Folders:
        return self.folders if self.tenants is None else self.tenants.of(job.tenant)

    def _outputs(self, job: Job) -> OutputCopier | OutputReferencer:
        if self.settings.copy_outputs:
            counters = self.services.get(SHARED_COUNTERS)
            return OutputCopier(self._folders(job), self._fetch, counters)
        return OutputReferencer(self.client.spec.name)

    async def _fetch(self, filename: str, subfolder: str, kind: str) -> bytes:
        params = {"filename": filename, "subfolder": subfolder, "type": kind}
        return await self.client.read_bytes("/view", params)


def backend_body(job: Job, entries: dict[str, Any]) -> dict[str, Any]:
    """The `POST /prompt` body a backend is sent: the job's extra_data with `entries` (the
    hold, the allowance), less what the gateway does itself (the backend sends no webhook
    of its own: this gateway delivers the job's end)."""
    extra = {k: v for k, v in job.extra_data.items() if k not in BACKEND_DROPS}
    body = {"prompt": job.prompt, "prompt_id": job.prompt_id, "extra_data": extra | entries}
    if job.outputs:
        body["partial_execution_targets"] = job.outputs
    return body


async def _nothing() -> None:
    return None


def _ignore() -> None:
    return None


async def ask_pack(client: BackendClient) -> tuple[bool, bool]:
    """The backend's `pack_features`. Unreachable, it raises: what it was stays known,
    and a comfyfleet out of reach still holds its prompts until their hold runs out."""
    try:
        pack = await client.request("GET", PACK_ROUTE, timeout=10.0)
    except BackendAnswered:
        return False, False  # there, without the pack
    return pack_features(pack)


def _maybe_taken(exc: BackendError) -> bool:
    """Whether a submit that failed so may still have reached the backend (its answer
    lost): not when it answered, nor when nothing listened."""
    return not isinstance(exc, BackendAnswered) and not _refused(exc)


def _refused(exc: BaseException) -> bool:
    """Whether the connection was refused: no process listens there."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        if isinstance(seen, aiohttp.ClientConnectorError) and isinstance(
            seen.os_error, ConnectionRefusedError
        ):
            return True
        seen = seen.__cause__
    return False


async def _first_set(events: tuple[asyncio.Event, ...], timeout: float) -> None:
    """Return once one of `events` is set, or after `timeout` seconds."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
