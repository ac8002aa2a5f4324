"""The fan-out service: shared pools, the journal, and every task of the process.

Nodes reach it as the engine service "fanout". Asking for a job first looks for
the same request running here, then in the journal (a finished result is
reused; a live job is followed: waited on while another gateway runs it, polled
once it is this gateway's or its owner is gone), and only then sends a new one.
Jobs run in pool slots owned by the service, never in the prompt's own node
tasks, so a collector can wait for them from anywhere.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from comfyfleet.domain.remote_jobs import RemoteJob, RemoteJobState
from comfyfleet.engine.context import NodeContext
from comfyfleet.engine.services import ServiceKey, Services
from comfyfleet.fanout import secrets
from comfyfleet.fanout.drivers import Driver
from comfyfleet.fanout.follow import LOST_IN_FLIGHT, FollowActions, Follower, lost_error
from comfyfleet.fanout.limits import Throttle
from comfyfleet.fanout.lookups import BatchedLookups
from comfyfleet.fanout.pool import Pool
from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.fanout.results import result_value, skipped_value
from comfyfleet.fanout.runner import Job, JobRunner, describe
from comfyfleet.fanout.secrets import SecretVault
from comfyfleet.fanout.session import SessionLease
from comfyfleet.fanout.settings import FanoutSettings
from comfyfleet.fanout.task import UNUSABLE, Task, TaskInfo, TaskState
from comfyfleet.fanout.watch import PromptWatch
from comfyfleet.provider_http.errors import AmbiguousSubmit
from comfyfleet.provider_http.retry import Cooldown
from comfyfleet.spend.guard import BudgetGuard
from comfyfleet.store.base import RemoteJobJournal

log = logging.getLogger(__name__)

SERVICE: ServiceKey[FanoutService] = ServiceKey("fanout")
IMAGE, VIDEO = "image", "video"

_LIVE = frozenset({RemoteJobState.SUBMITTING, RemoteJobState.RUNNING})


class FanoutService:
    def __init__(
        self,
        journal: RemoteJobJournal,
        vault: SecretVault | None = None,
        settings: FanoutSettings | None = None,
        drivers: Mapping[str, Driver] | None = None,
        *,
        resume: bool = True,
        budgets: BudgetGuard | None = None,
    ) -> None:
        """`resume`: at first use, re-attach every job the journal says an earlier
        process left running (a server's journal). Off for one-shot runs sharing a
        journal file, where another run may be following those jobs right now: a job
        is then re-attached only when a prompt asks for it again. `budgets`: each new
        paid job is checked against its tenant's and its prompt's budgets (None: none)."""
        settings = settings or FanoutSettings()
        self.journal = journal
        self._reusable = BatchedLookups(journal)
        self.vault = vault or SecretVault()
        # The providers it can send to, by name: whoever builds the process composes them
        # (comfyfleet.nodes.providers.DRIVERS); fan-out knows no provider itself.
        self.drivers = dict(drivers or {})
        self.pools = {IMAGE: Pool(IMAGE, settings.image), VIDEO: Pool(VIDEO, settings.video)}
        #: Bumped whenever a job fails or is cancelled: nodes put it in IS_CHANGED, so a
        #: cached failure is never replayed and re-queuing retries exactly what failed.
        self.failure_epoch = 0
        self.sessions = SessionLease()
        self.watch = PromptWatch(self.cancel)
        #: The collectors waiting now, by (prompt id, node id): their mode and slots, for
        #: whoever shows their progress (the fleet dashboard).
        self.collecting: dict[tuple[str, str], tuple[str, list[Task | None]]] = {}
        self._live: dict[str, Task] = {}  # request hash -> the task running it here
        #: Every task running or waiting in a pool here (local ones too), for metrics.
        self.tasks: set[Task] = set()
        #: Tasks ended here, by (provider, final state); results reused from the journal,
        #: by provider (no job sent). Counted since start, read by metrics.
        self.ended: Counter[tuple[str, str]] = Counter()
        self.reused: Counter[str] = Counter()
        self._lookups: dict[str, asyncio.Future[None]] = {}
        self._throttles: dict[tuple[str, str, str], Throttle] = {}
        self._cooldowns: dict[tuple[str, str, str], Cooldown] = {}
        self._runners: set[asyncio.Task[None]] = set()
        self._resumed: asyncio.Future[None] | None = None
        self._resume = resume
        self._sweeper: asyncio.Task[None] | None = None
        actions = FollowActions(self._send_into, self._poll_into, self._reuse_into, self._fail)
        self.follower = Follower(journal, actions)
        self.runner = JobRunner(
            journal,
            self.vault,
            self.sessions,
            self._throttle,
            self._cooldown,
            self._unusable,
            self.follower.follow,
            budgets,
        )

    def services(self) -> Services:
        """The engine services this provides: itself and its key vault."""
        services = Services()
        services.add(SERVICE, self)
        services.add(secrets.SERVICE, self.vault)
        return services

    # -- asking for jobs ---------------------------------------------------------

    async def submit(self, request: RemoteRequest, node: NodeContext | None) -> Task:
        """The task for `request`: one running here, a journaled result, or a new job."""
        if request.provider not in self.drivers:
            raise ValueError(f"no driver for provider {request.provider!r}")
        await self._resume_once()
        task = await self._single_flight(request, node)
        self.hold([task], node)
        return task

    async def _single_flight(self, request: RemoteRequest, node: NodeContext | None) -> Task:
        """Equal requests asked for at the same moment share one lookup (and one job)."""
        key = request.request_hash
        while True:
            live = self._live.get(key)
            if live is not None and live.state not in UNUSABLE:
                return live
            busy = self._lookups.get(key)
            if busy is None:
                break
            await asyncio.wait([busy])  # then look again: it may have failed or been cancelled
        done = self._lookups[key] = asyncio.get_running_loop().create_future()
        try:
            return await self._find_or_send(request, node)
        finally:
            del self._lookups[key]
            done.set_result(None)

    async def _find_or_send(self, request: RemoteRequest, node: NodeContext | None) -> Task:
        found = await self._reusable.reusable(request.request_hash)
        if found is not None:
            if found.state == RemoteJobState.SUCCEEDED and found.result is not None:
                return await self._reused(found, request, node)
            if found.state in _LIVE:  # another gateway's, or left by an earlier process
                task = self._new_task(request, node)
                self._start(task, self.follower.follow(task, found, request))
                return task
            if _lost_in_flight(found) and node is not None and found.prompt_id == node.prompt_id:
                # The same prompt, run again after a restart: never send it twice by itself.
                return self._failed_now(
                    request, node, AmbiguousSubmit(found.provider, LOST_IN_FLIGHT)
                )
        place = await self.pools[request.kind].join(_waiting_text(node))
        task = self._new_task(request, node)
        driver = self.drivers[request.provider]
        self._start(task, self.runner.run(Job(task, driver, request.api, request), place))
        return task

    def _new_task(self, request: RemoteRequest, node: NodeContext | None) -> Task:
        """A task for `request`, the one this gateway runs or follows for it from now."""
        task = Task(request.kind, _info(request, node, self.drivers), request.request_hash)
        self._live[request.request_hash] = task
        return task

    async def _reused(
        self, found: RemoteJob, request: RemoteRequest, node: NodeContext | None
    ) -> Task:
        task = Task(found.kind, _info(request, node, self.drivers), found.request_hash)
        await self._reuse_into(task, found)
        return task

    async def _reuse_into(self, task: Task, found: RemoteJob) -> None:
        """Settle `task` with a finished job's result: no job sent for it."""
        assert found.result is not None
        data = found.result
        value = await asyncio.to_thread(result_value, found.kind, data)
        info = task.info
        info.reused = True
        info.journal_id, info.remote_id, info.attempts = found.id, found.remote_id, found.attempts
        task.settle(TaskState.SUCCESS, value)
        self.reused[found.provider] += 1

    async def _send_into(self, task: Task, request: RemoteRequest) -> None:
        """Send `request` as a new job for a task that followed one which ended unused."""
        place = await self.pools[request.kind].join()
        driver = self.drivers[request.provider]
        await self.runner.run(Job(task, driver, request.api, request), place)

    async def _poll_into(self, task: Task, record: RemoteJob) -> None:
        """Poll a journaled job that has a remote id for `task`: no new request."""
        place = await self.pools[record.kind].join()
        api = ApiConfig.from_resume(record.resume)
        await self.runner.run(Job(task, self.drivers[record.provider], api, record=record), place)

    async def _fail(self, task: Task, error: Exception, request: RemoteRequest | None) -> None:
        describe(task, error, self.vault.redactor().text)
        if request is not None and request.skip_error:
            value = await asyncio.to_thread(skipped_value, task.kind)
            task.settle(TaskState.SKIPPED_ERROR, value, error)
        else:
            task.settle(TaskState.FAILED, None, error)
        self._unusable(task)

    def _failed_now(
        self, request: RemoteRequest, node: NodeContext | None, error: Exception
    ) -> Task:
        task = Task(request.kind, _info(request, node, self.drivers), request.request_hash)
        describe(task, error, self.vault.redactor().text)
        task.settle(TaskState.FAILED, None, error)
        self._unusable(task)
        return task

    async def submit_local(
        self, kind: str, call: Callable[[], Awaitable[Any]], node: NodeContext | None
    ) -> Task:
        """A task for a node without a remote job: its own function, run in the pool."""
        place = await self.pools[kind].join(_waiting_text(node))
        info = TaskInfo("local", node.node_id if node else None, node.prompt_id if node else None)
        task = Task(kind, info)

        async def run() -> None:
            try:
                await place.wait_running()
                task.start()
                task.settle(TaskState.SUCCESS, await call())
            except asyncio.CancelledError:
                task.settle(TaskState.CANCELLED)
                self._unusable(task)
            except Exception as exc:
                describe(task, exc, self.vault.redactor().text)
                task.settle(TaskState.FAILED, None, exc)
                self._unusable(task)
            finally:
                place.leave()

        self._start(task, run())
        self.hold([task], node)
        return task

    def _start(self, task: Task, work: Awaitable[None]) -> None:
        # A clean context: the job outlives the node that asked for it.
        runner = asyncio.create_task(_coroutine(work), context=contextvars.Context())
        task.runner = runner
        self._runners.add(runner)
        runner.add_done_callback(self._runners.discard)
        self.tasks.add(task)
        task.finished.add_done_callback(lambda _f: self._forget(task))

    def _forget(self, task: Task) -> None:
        self.tasks.discard(task)
        self.ended[(task.info.provider, task.state.value)] += 1
        # Finished results live in the journal and the engine's cache, not here.
        if task.request_hash is not None and self._live.get(task.request_hash) is task:
            del self._live[task.request_hash]

    def _unusable(self, task: Task) -> None:
        self.failure_epoch += 1

    # -- after a restart, and jobs whose gateway died ------------------------------------

    async def resume(self, every: float | None = None) -> None:
        """Re-attach the remote jobs an earlier process of this gateway left running, and
        those of gateways that are gone (at start-up). With `every`, look again at that
        interval: what a gateway dying later leaves is taken over, polled, never resent."""
        await self._resume_once()
        if every is not None and self._resume and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(every), name="fanout-take-over")

    async def _resume_once(self) -> None:
        if not self._resume:
            return
        if self._resumed is None:
            # A clean context: the task is kept for the service's life, and the asking
            # node's context would keep that prompt's run (and all its outputs) alive.
            self._resumed = asyncio.create_task(self._take_over(), context=contextvars.Context())
        await asyncio.shield(self._resumed)

    async def _sweep(self, every: float) -> None:
        while not self.runner.detached:
            await asyncio.sleep(every)
            await self._take_over()

    async def _take_over(self) -> None:
        """Adopt and re-attach every live job that is this gateway's or orphaned, and not
        followed here yet (first use, not start-up: the store opens after the service is
        made). Another live gateway's jobs are left alone."""
        try:
            records = await self.journal.live_remote_jobs()
        except Exception:
            log.exception("cannot read the remote-job journal; nothing re-attached")
            return
        taken = 0
        for record in records:
            if record.request_hash in self._live or self.runner.detached:
                continue
            try:
                adopted = await self.journal.adopt_remote_job(record.id)
                if adopted is None:  # ended, or another gateway took it first
                    continue
                if adopted.remote_id is None:  # lost in flight: it cannot be polled
                    error = lost_error()
                    await self.journal.finish_remote_job(
                        adopted.id, RemoteJobState.FAILED, error=error
                    )
                else:
                    self._attach(adopted)
            except Exception:
                log.exception("cannot take over remote job %s", record.id)
                continue
            taken += 1
        if taken:
            log.info("took over %d remote job(s) left running", taken)

    def _attach(self, record: RemoteJob) -> Task:
        """Follow a journaled job, this gateway's, that has a remote id: poll it."""
        info = TaskInfo(record.provider, record.node_id, record.prompt_id)
        info.journal_id, info.remote_id = record.id, record.remote_id
        info.endpoint = ApiConfig.from_resume(record.resume).base_url
        task = Task(record.kind, info, record.request_hash)
        self._live[record.request_hash] = task
        self._start(task, self._poll_into(task, record))
        return task

    # -- waiting and cancelling -----------------------------------------------------------

    def hold(self, tasks: Iterable[Task], node: NodeContext | None) -> None:
        """The node's prompt waits for these tasks (an interrupt of it may cancel them)."""
        if node is None:
            return
        for task in tasks:
            self.watch.hold(task, node.prompt_id, node.control)

    async def abandon(self, tasks: Iterable[Task], node: NodeContext | None) -> None:
        """A waiting node is being cancelled. If its prompt was interrupted, cancel what
        only that prompt held, at the provider too, before the node ends; if the prompt
        failed elsewhere, leave the jobs to finish into the journal for a re-queue."""
        if node is None or not node.control.interrupted:
            return
        cleanup = asyncio.ensure_future(self.cancel(self.watch.release(node.prompt_id, tasks)))
        while not cleanup.done():
            try:
                await asyncio.shield(cleanup)
            except asyncio.CancelledError:
                # The engine cancels a node once more while it winds down; the provider
                # cancels still go out first (each is bounded by the runner's grace).
                continue

    async def cancel(self, tasks: Iterable[Task]) -> None:
        """Cancel queued and running tasks (at the provider too) and wait until they end."""
        runners = [t.runner for t in tasks if not t.done and t.runner is not None]
        for runner in runners:
            runner.cancel()
        if runners:
            await asyncio.gather(*runners, return_exceptions=True)

    def detach_soon(self) -> None:
        """From now on, a job cut off is left running at the provider (shutdown)."""
        self.runner.detached = True

    async def detach(self) -> None:
        """Stop following remote jobs without cancelling them (the process is going away):
        their journal entries stay running and the next process re-attaches to them."""
        self.runner.detached = True
        await self.close()

    async def close(self) -> None:
        """Cancel whatever still runs (for `comfyfleet run` and tests)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self.watch.close()
        for runner in list(self._runners):
            runner.cancel()
        await asyncio.gather(*self._runners, return_exceptions=True)
        await self.sessions.close()

    # -- per-provider state -----------------------------------------------------------

    def _throttle(self, provider: str, api: ApiConfig) -> Throttle:
        key = (provider, api.base_url.rstrip("/"), api.key_ref)
        if key not in self._throttles:
            self._throttles[key] = Throttle(api.max_concurrency, api.requests_per_second)
        return self._throttles[key]

    def rate_limits(self) -> dict[str, tuple[int, int]]:
        """By provider: the 429s its endpoints answered, and the cooldowns they caused."""
        totals: dict[str, tuple[int, int]] = {}
        for (provider, _url, _key), cooldown in list(self._cooldowns.items()):
            limited, pauses = totals.get(provider, (0, 0))
            totals[provider] = (limited + cooldown.rate_limited_count, pauses + cooldown.pauses)
        return totals

    def _cooldown(self, provider: str, api: ApiConfig) -> Cooldown:
        # Rate limits belong to the account: one cooldown per endpoint and key.
        key = (provider, api.base_url.rstrip("/"), api.key_ref)
        return self._cooldowns.setdefault(key, Cooldown())


def _lost_in_flight(record: RemoteJob) -> bool:
    if record.state == RemoteJobState.SUBMITTING:
        return True
    error = record.error or {}
    return record.state == RemoteJobState.FAILED and error.get("class") == "AmbiguousSubmit"


def _info(
    request: RemoteRequest, node: NodeContext | None, drivers: Mapping[str, Driver]
) -> TaskInfo:
    info = TaskInfo(
        request.provider, node.node_id if node else None, node.prompt_id if node else None
    )
    info.endpoint = drivers[request.provider].endpoint(request)
    return info


def _waiting_text(node: NodeContext | None) -> Callable[[int], None] | None:
    if node is None:
        return None
    return lambda ahead: node.send_text(f"waiting for a slot, {ahead} ahead")


async def _coroutine(work: Awaitable[None]) -> None:
    await work
