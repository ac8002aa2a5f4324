"""A ComfyUI lane: jobs run on one ComfyUI backend (a real ComfyUI or another comfyfleet)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from comfyfleet.domain.jobs import HOLD_KEY, HOLDS_FEATURE, HOLDS_ROUTE, Job, JobResult, JobStatus
from comfyfleet.domain.webhooks import EVENTS_KEY, URL_KEY
from comfyfleet.engine.events import EngineEvent, EventSink, Message
from comfyfleet.engine.services import Services
from comfyfleet.errors import ComfyfleetError
from comfyfleet.folders import Folders
from comfyfleet.lanes.backend import (
    MAX_FILE_BYTES,
    BackendClient,
    BackendError,
    BackendLost,
    BackendSpec,
    FileAnswer,
    PromptWatch,
    Withdrawn,
)
from comfyfleet.lanes.base import Adopt, LaneRun, adopt_none
from comfyfleet.lanes.capabilities import Capabilities, Key, KnownCapabilities
from comfyfleet.lanes.endings import (
    foreign_file_answer,
    refused_result,
    succeeded,
    unsafe_output_result,
    withdrawn_result,
)
from comfyfleet.lanes.outputs import (
    OutputCopier,
    OutputReferencer,
    UnsafeOutput,
    output_files,
)
from comfyfleet.lanes.uploads import FetchInputs, ForeignFile, InputPusher
from comfyfleet.nodes.core.saving import SHARED_COUNTERS
from comfyfleet.protocol import events
from comfyfleet.tenants import TenantFolders

log = logging.getLogger(__name__)


class BackendHung(BackendError):
    """No frame for a running prompt within the hang timeout."""


#: The companion pack's routes (comfyfleet.comfyui_pack; comfyfleet serves them too).
#: Seconds without a frame from a running prompt before the backend's history is asked
#: whether it ended (and again as often while it stays quiet).
QUIET_ASK = 5.0
#: Beyond a comfyfleet backend's hold, before its prompt is taken for lost (s): the two
#: clocks need not tick alike.
HOLD_MARGIN = 1.0
PACK_ROUTE = "/comfyfleet/pack"
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


class Submits:
    """Prompts being submitted to the backends of one fleet. A finished prompt's history
    read lets those already under way go first: a submit is what keeps a backend busy,
    and when many backends finish at once their hand-overs all compete for the CPU.

    Submits are numbered as they start; a wait ends when the oldest still under way is
    newer than the newest at its start (one future per wait, whatever the number of
    submits: a thousand backends finishing together each wait once)."""

    def __init__(self) -> None:
        self._numbers = itertools.count()
        self._under_way: dict[int, None] = {}  # in the order they started
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        number = next(self._numbers)
        self._under_way[number] = None
        try:
            yield
        finally:
            del self._under_way[number]
            self._release()

    def _release(self) -> None:
        oldest = next(iter(self._under_way), None)
        while self._waiting and (oldest is None or self._waiting[0][0] < oldest):
            _, waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def let_pass(self, timeout: float = 1.0) -> None:
        """Wait for the submits under way now (never for a stream of later ones)."""
        if not self._under_way:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((next(reversed(self._under_way)), waiter))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, timeout)


@dataclass(frozen=True)
class LaneSettings:
    hang_timeout: float = 300.0  # seconds without a frame while a prompt runs there
    copy_outputs: bool = True
    probe_interval: float = 5.0  # health check of a connected backend
    suspect_for: float = 60.0  # after a hang, no new work for this long
    refresh_interval: float = 60.0  # re-read object_info (new nodes, new model files)
    max_backoff: float = 30.0  # longest wait between reconnect attempts
    # A comfyfleet backend runs this gateway's prompts only while told, this long each
    # time (renewed every probe): a backend lost longer than this has dropped them.
    hold: float = 30.0


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
        self._suspect_until = 0.0  # a hung prompt there: no new work until then
        self.validates = False  # it has the companion pack: `validate` asks it
        self.holds = False  # a comfyfleet: it runs this gateway's prompts only while told
        self._refused = False  # the last connection attempt was refused: no process there
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
        # Called when capabilities change, so the fleet can rebuild its node union.
        self.on_change: Callable[[], Awaitable[None]] = _nothing
        # Called as the backend accepts each prompt (a managed backend counts them).
        self.on_sent: Callable[[], None] = _ignore

    @property
    def suspect(self) -> bool:
        return time.monotonic() < self._suspect_until

    def can_run(self, job: Job) -> bool:
        # Runs in the store's writer thread: reads a few fields, changes nothing.
        return (
            self.up
            and not self.draining
            and not self.held
            and not self.suspect
            and self.capabilities.can_run(job.prompt)
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
            handle.on_interrupt(lambda: self._interrupt_soon(watch))
            handle.offer_back(lambda: self._withdraw(watch), lambda: not watch.started)
            return await self._follow(job, watch, sink, handle)
        except Withdrawn:
            handle.withdrawn = True
            return withdrawn_result(job)
        finally:
            self.client.unwatch(job.prompt_id)

    async def _send(
        self, job: Job, watch: PromptWatch, sink: EventSink, handle: LaneRun
    ) -> JobResult | None:
        """Submit the job's prompt, its files pushed first; None once the backend queued
        it, else how the run ended without that (refused, or known there already)."""
        if job.attempt > 1:
            # An earlier attempt may have reached it (and ended there) unbeknown.
            known = await self._rejoin(job, watch, sink, handle, successes_only=True)
            if known is not None:
                return known
        try:
            prompt = await self._pusher.push_for(job.prompt, self._folders(job), job.tenant)
            await self._submit(replace(job, prompt=prompt))
            watch.kept_at = time.monotonic()  # it holds the prompt from its answer on
        except ForeignFile as foreign:
            return refused_result(job, foreign_file_answer(job.prompt, foreign))
        except PromptRefused as refused:
            if not refused.duplicate:
                return refused_result(job, refused.answer)
            # A backend that keeps ids (another comfyfleet) has it from before.
            known = await self._rejoin(job, watch, sink, handle, successes_only=True)
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
            return await self._rejoin(job, watch, sink, handle)
        except Withdrawn:
            handle.withdrawn = True
            return withdrawn_result(job)
        finally:
            self.client.unwatch(job.prompt_id)

    async def _rejoin(
        self,
        job: Job,
        watch: PromptWatch,
        sink: EventSink,
        handle: LaneRun,
        *,
        successes_only: bool = False,
    ) -> JobResult | None:
        """The result of a prompt the backend already knows: collected from its history
        (its files and `executed` frames re-sent: the client missed them), or followed
        if it is queued or running there; None if it has never heard of it (or, with
        `successes_only`, holds no success for it)."""
        entry = await self.client.history(job.prompt_id)
        if entry is None:
            running, pending = await self.client.queue_ids()
            if job.prompt_id in running | pending:
                watch.started = job.prompt_id in running
                handle.accept()
                handle.on_interrupt(lambda: self._interrupt_soon(watch))
                return await self._follow(job, watch, sink, handle)
            entry = await self.client.history(job.prompt_id)  # it may have just ended
        if entry is None or (successes_only and not succeeded(entry)):
            return None
        result = await self._result(job, entry, self._outputs(job))
        for node_id, output in result.outputs.items():
            sink(Message("executed", events.executed(job.prompt_id, node_id, output)))
        return result

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
                self._refused = False
                backoff = 0.5
                await self._watch_health()
            except BackendError as exc:
                self._refused = _refused(exc)
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
        if self.holds and keep:
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
        try:
            pack = await self.client.request("GET", PACK_ROUTE, timeout=10.0)
        except BackendError:
            pack = None
        self.validates = isinstance(pack, dict) and pack.get("pack") == "comfyfleet"
        # A comfyfleet server with a durable queue of its own: it holds what this gateway
        # sent across its restarts until told which of it is still wanted.
        self.holds = self.validates and isinstance(pack, dict) and pack.get(HOLDS_FEATURE) is True
        object_info = await self.client.json_bytes("/object_info", timeout=60.0)
        models: dict[str, list[str]] = {}
        folders = await self.client.request("GET", "/models", timeout=30.0)
        for folder in folders if isinstance(folders, list) else []:
            try:
                files = await self.client.request("GET", f"/models/{folder}", timeout=30.0)
            except BackendError:
                continue  # a folder it lists but cannot read: no files known there
            if isinstance(files, list):
                models[str(folder)] = [str(f) for f in files]
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
            if self.holds:
                every = min(every, self.settings.hold / 3)
            await _first_set((self._retry, self.client.disconnected), every)
            if self._retry.is_set():  # a new process answers: this connection was the old one's
                self._retry.clear()
                continue
            if not self.client.connected.is_set():
                break
            await self.client.request("GET", "/prompt", timeout=10.0)
            if self.holds:
                watched = self.client.watched().items()
                await self._keep(sorted(p for p, watch in watched if not watch.abandoned))
            if time.monotonic() - refreshed > self.settings.refresh_interval:
                if await self._refresh():
                    await self.on_change()
                refreshed = time.monotonic()
        raise BackendError("websocket closed")

    async def _keep(self, prompt_ids: list[str]) -> None:
        """Tell the backend this gateway still wants these prompts (see
        scheduler/holds.py); each watch learns from when it holds them again."""
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
        for prompt_id in answer["kept"]:
            if isinstance(prompt_id, str) and prompt_id in watched:
                watched[prompt_id].kept_at = now

    async def _still_there(self, watch: PromptWatch) -> bool:
        """Whether the backend, reached again, holds the prompt (queued, running or
        ended); True while it cannot say: it is asked again at the next tick."""
        try:
            return not await self._gone(watch.prompt_id)
        except BackendError:
            return True

    def _given_up(self, watch: PromptWatch, now: float) -> bool:
        """Whether a prompt of a backend this gateway cannot reach is lost: at once for a
        ComfyUI (it forgets its queue when it dies) and for a process that is gone (its
        port refuses: started again, a comfyfleet holds the prompt until told); else
        once the backend's hold on it has surely run out (a paused or cut-off comfyfleet
        has stopped it by then), not before, so it never runs in two places."""
        if not self.holds or self._refused:
            return True
        return now > watch.kept_at + self.settings.hold + HOLD_MARGIN

    async def _submit(self, job: Job) -> None:
        # The backend sends no webhook of its own: this gateway delivers the job's end.
        extra = {k: v for k, v in job.extra_data.items() if k not in BACKEND_DROPS}
        if self.holds:
            extra[HOLD_KEY] = self.settings.hold
        body = {"prompt": job.prompt, "prompt_id": job.prompt_id, "extra_data": extra}
        if job.outputs:
            body["partial_execution_targets"] = job.outputs
        with self.submits.sending():
            status, answer = await self.client.submit(body)
        if status == 400 and isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            raise PromptRefused(answer)
        if status != 200:
            raise BackendError(f"backend {self.client.spec.name} refused the prompt: {answer}")
        self.on_sent()

    def _interrupt_soon(self, watch: PromptWatch) -> None:
        """Out of the backend's queue if it has not started there, else interrupted."""

        async def interrupt() -> None:
            if not await self._withdraw(watch):
                with contextlib.suppress(BackendError):
                    await self.client.interrupt(watch.prompt_id)

        asyncio.get_running_loop().create_task(interrupt())

    async def _withdraw(self, watch: PromptWatch) -> bool:
        """Take a prompt that has not started out of the backend's queue: its run ends
        here, as no frame of it will come. False if it runs (or ran) there."""
        if watch.started:
            return False
        try:
            await self.client.delete_pending(watch.prompt_id)
            if watch.started or not await self._gone(watch.prompt_id):
                return False  # it started meanwhile: it runs there
        except BackendError:
            return False
        watch.queue.put_nowait(Withdrawn(watch.prompt_id))
        return True

    async def _gone(self, prompt_id: str) -> bool:
        """Neither queued, running nor finished on the backend."""
        running, pending = await self.client.queue_ids()
        if prompt_id in running | pending:
            return False
        return await self.client.history(prompt_id) is None

    async def _follow(
        self, job: Job, watch: PromptWatch, sink: EventSink, handle: LaneRun
    ) -> JobResult:
        """Relay the prompt's frames until its done signal, then read its history.

        The backend's end event comes just before its done signal (which waits for its
        history write): the watch releases the slot there, so the next prompt is on its
        way while this one's outputs are copied and its history written and read."""
        copier = self._outputs(job)
        copied: dict[str, Any] = {}  # node -> its output, as relayed
        watch.start_ticks(1.0)
        while True:
            event = await self._next(job, watch)
            if isinstance(event, Message):
                if event.type == "executing" and event.data.get("node") is None:
                    break
                if event.type == "executed":
                    node = event.data.get("node")
                    try:
                        output = await copier.localize(event.data.get("output"))
                    except UnsafeOutput as exc:
                        self._interrupt_soon(watch)  # the prompt has failed: stop it there
                        name = self.client.spec.name
                        return unsafe_output_result(job, node, name, exc, copied)
                    copied[str(node)] = output
                    event = Message("executed", {**event.data, "output": output})
            sink(event)
        entry = await self._history_after_done(job.prompt_id)
        return await self._result(job, entry, copier)

    async def _next(self, job: Job, watch: PromptWatch) -> EngineEvent:
        asked = time.monotonic()
        while True:
            event = await watch.queue.get()
            if event is None:  # the watch's tick: check the clock and the connection
                now = time.monotonic()
                idle = now - watch.last_frame
                if watch.started and idle > self.settings.hang_timeout and not watch.abandoned:
                    # Hung: it answers (a keep since its last frame), yet sends nothing
                    # for the prompt. A comfyfleet that answers nothing either is paused
                    # or cut off: its hold stops the prompt there, and it may go on in
                    # time; given up only once that hold has surely run out.
                    answering = not self.holds or watch.kept_at > watch.last_frame
                    if answering or self._given_up(watch, now):
                        self._suspect_until = time.monotonic() + self.settings.suspect_for
                        self._interrupt_soon(watch)
                        watch.abandoned = True  # kept no more: a comfyfleet stops it in time
                if watch.abandoned and self._given_up(watch, now):
                    raise BackendHung(f"no frame from {self.client.spec.name} for {idle:.0f} s")
                if not self.client.connected.is_set():
                    if self._given_up(watch, now):
                        raise BackendLost(f"backend {self.client.spec.name} went away")
                    continue
                if watch.lost and await self._still_there(watch):
                    watch.lost = False
                elif watch.lost:
                    raise BackendLost(f"backend {self.client.spec.name} came back without it")
                if idle >= QUIET_ASK and now - asked >= QUIET_ASK and not watch.abandoned:
                    asked = now
                    if await self._ended_quietly(job):
                        # Its frames go elsewhere (submitted by a gateway that died, then
                        # adopted here), or its done signal was lost: it ended there.
                        return Message("executing", events.executing(job.prompt_id, None))
                continue
            if isinstance(event, BackendLost) and not self._given_up(watch, time.monotonic()):
                watch.lost = True  # it may still run it there: the ticks look again
                continue
            if isinstance(event, BackendError):  # lost, or withdrawn from its queue
                raise event
            if watch.abandoned:
                continue  # given up on there (hung): it runs again elsewhere, whatever comes
            return event

    async def _ended_quietly(self, job: Job) -> bool:
        try:
            return await self.client.history(job.prompt_id) is not None
        except BackendError:
            return False  # asked again later; a lost backend is noticed on its own

    async def _history_after_done(self, prompt_id: str) -> dict[str, Any]:
        await self.submits.let_pass()
        for delay in (0.0, 0.05, 0.2, 0.5, 1.0):
            await asyncio.sleep(delay)
            entry = await self.client.history(prompt_id)
            if entry is not None:
                return entry
        raise BackendError(f"backend {self.client.spec.name} has no history for {prompt_id}")

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

    async def _result(
        self,
        job: Job,
        entry: dict[str, Any],
        copier: OutputCopier | OutputReferencer,
    ) -> JobResult:
        status = entry.get("status") or {}
        messages = status.get("messages") or []
        outputs: dict[str, Any] = {}
        for node, ui in (entry.get("outputs") or {}).items():
            try:
                outputs[node] = await copier.localize(ui)
            except UnsafeOutput as exc:
                return unsafe_output_result(job, node, self.client.spec.name, exc, outputs)
        last_event, last_data = messages[-1] if messages else ("", {})
        error: dict[str, Any] | None = last_data if isinstance(last_data, dict) else None
        if status.get("completed") or status.get("status_str") == "success":
            state, error = JobStatus.SUCCESS, None
        elif last_event == "execution_interrupted":
            state = JobStatus.INTERRUPTED
        else:
            state = JobStatus.ERROR
        return JobResult(
            state, outputs, entry.get("meta") or {}, messages, error, output_files(outputs)
        )


async def _nothing() -> None:
    return None


def _ignore() -> None:
    return None


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
