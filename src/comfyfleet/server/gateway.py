"""The gateway: every long-lived part of a running server, started and stopped together."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from comfyfleet.domain.backend_names import FleetError
from comfyfleet.domain.budgets import day_start
from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.engine.executor import Engine
from comfyfleet.engine.validation import ValidationResult, validate_prompt
from comfyfleet.fanout import FanoutService, FanoutSettings, PoolSize, SecretVault
from comfyfleet.folders import Folders, using_folders
from comfyfleet.lanes.fleet import Fleet, parse_spec
from comfyfleet.lanes.local import remove_files
from comfyfleet.lanes.settings import LaneSettings
from comfyfleet.lanes.uploads import UploadInputs
from comfyfleet.managed.manager import ManagedBackends
from comfyfleet.nodes import build_registry
from comfyfleet.nodes.core.saving import SHARED_COUNTERS
from comfyfleet.nodes.providers import DRIVERS
from comfyfleet.peers import PeerFiles, PeerKey
from comfyfleet.peers.cancel import PeerCancels
from comfyfleet.peers.copies import prune_copies
from comfyfleet.peers.names import FleetNames
from comfyfleet.scheduler.scheduler import Scheduler
from comfyfleet.server.backend_owners import BackendOwnership
from comfyfleet.server.config import ServerConfig
from comfyfleet.server.delivery.client_events import ClientRouter, StatusBroadcaster
from comfyfleet.server.delivery.event_log import EventLog
from comfyfleet.server.delivery.hub import Hub
from comfyfleet.server.delivery.relay import ClientRelay
from comfyfleet.server.identity import process_alive, this_gateway
from comfyfleet.spend.guard import BudgetGuard, StoredPromptTerms
from comfyfleet.spend.holds import BackendBudgets
from comfyfleet.spend.today import SpendToday
from comfyfleet.store.base import GatewayIdInUse, JobStore, StoreError
from comfyfleet.store.factory import open_store
from comfyfleet.store.postgres_parts.url import is_postgres_url
from comfyfleet.tenants import DEFAULT_TENANT, TenantFolders
from comfyfleet.webhooks import WebhookSender, WebhookSettings
from comfyfleet.webhooks.signing import parse_secret

log = logging.getLogger(__name__)

#: ComfyUI's error when every output failed on its nodes' inputs.
NODES_FAILED = "prompt_outputs_failed_validation"


@dataclass
class Gateway:
    config: ServerConfig
    folders: Folders
    engine: Engine
    store: JobStore
    fanout: FanoutService
    fleet: Fleet
    hub: Hub
    router: ClientRouter
    scheduler: Scheduler
    tenants: TenantFolders  # `default` (all jobs when auth is off) has `folders`
    managed: ManagedBackends  # the backend processes it runs itself ([[comfyui]])
    identity: GatewayRecord  # this gateway among those sharing the store
    webhooks: WebhookSender  # job ends to webhooks, from the store's outbox
    events: EventLog | None  # every prompt's client stream, for followers (None: kept off)
    owners: BackendOwnership  # the backends this gateway dispatches to, of those it knows
    relay: ClientRelay | None  # other gateways' prompts to this one's clients (None: no others)
    peers: PeerFiles  # files another gateway of the store holds, fetched when asked for
    peer_key: PeerKey  # the key signing requests between the gateways of the store
    peer_cancels: PeerCancels  # cancels of jobs another gateway of the store runs
    serving: bool = False  # from the end of `start` to the beginning of `drain`
    spend_today: SpendToday = field(init=False)  # tenants' paid jobs of the day, as shown
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _uploads: UploadInputs = field(default_factory=UploadInputs)

    def __post_init__(self) -> None:
        self.spend_today = SpendToday(self.store)

    @classmethod
    def create(cls, config: ServerConfig) -> Gateway:
        folders = Folders.under(config.data_dir).ensure()
        tenants = TenantFolders(folders, config.data_dir / "tenants")
        registry = build_registry(testing=config.testing_nodes, custom_nodes=config.custom_nodes)
        for failure in registry.failures:
            log.warning("node pack %s skipped: %s", failure.pack, failure.error)
        identity = this_gateway(
            config.gateway_id, config.data_dir, config.host, config.port, config.peer_url
        )
        store = open_store(
            config.store,
            default=config.database,
            sqlite_synchronous=config.sqlite_synchronous,
            owner=identity.id,
        )
        # Paid API jobs: shared pools, the store's journal, keys (fan-out and provider nodes).
        fanout = FanoutService(
            store,
            SecretVault(config.secrets_file),
            fanout_settings(config),
            DRIVERS,
            budgets=BudgetGuard(config.shares, config.prices, StoredPromptTerms(store)),
        )
        engine = Engine(
            registry, folders, cache_entries=config.cache_entries, services=fanout.services()
        )
        hub = Hub()
        router = ClientRouter(hub, StatusBroadcaster(hub))
        settings = LaneSettings(
            hang_timeout=config.hang_timeout,
            copy_outputs=config.output_mode == "copy",
            hold=config.backend_hold,
        )
        peer_key = PeerKey(store)
        peers = PeerFiles(store, identity.id, peer_key, config.max_upload_bytes)
        # A backend's access log names the gateway that sent each request.
        agent = f"comfyfleet (gateway {identity.id})"
        budgets = BackendBudgets(store, config.shares, config.prices, registry)
        fleet = Fleet(
            engine,
            tenants,
            config.local_slots,
            settings,
            peers.ensure,
            agent=agent,
            budgets=budgets,
        )
        configured = [fleet.backend_lane(parse_spec(raw)).spec.name for raw in config.backends]
        managed = ManagedBackends.create(config.comfyui, config.data_dir, fleet, {config.port})
        scheduler = Scheduler(
            store,
            [],
            router,
            max_pending=config.max_pending,
            max_attempts=config.max_attempts,
            lease=config.lease,
            shares=config.shares,
            tenants=config.auth_enabled,
        )
        owners = BackendOwnership(
            store,
            fleet,
            scheduler,
            configured=configured,
            pinned=list(managed.instances),
            lease=config.lease,
        )
        webhooks = WebhookSender(store, webhook_settings(config))
        scheduler.observers.add(webhooks)
        events = relay = None
        if config.events_retention > 0:
            events = EventLog(
                store, config.events_retention, max_prompt_bytes=config.events_max_prompt_bytes
            )
            scheduler.observers.add(events)
            if shared_store(config):
                relay = ClientRelay(store, events, router, _recounter(scheduler, router))
                scheduler.observers.add(relay)
        return cls(
            config,
            folders,
            engine,
            store,
            fanout,
            fleet,
            hub,
            router,
            scheduler,
            tenants,
            managed,
            identity,
            webhooks,
            events,
            owners,
            relay,
            peers,
            peer_key,
            PeerCancels(store, identity.id, peer_key),
        )

    async def start(self) -> None:
        await self.store.open()
        await self._join()
        if self.store.shared:  # other gateways save files too: names come from the store
            names = FleetNames(self.store, self.config.data_dir, asyncio.get_running_loop())
            await names.prepare()
            self.engine.services.add(SHARED_COUNTERS, names)
        if self.events is not None:
            await self.events.start()
        if self.relay is not None:
            await self.relay.start()
        elif shared_store(self.config):
            log.warning(
                "events_retention = 0: with several gateways, a client gets the frames of "
                "the prompts its own gateway runs only (and subscribe and SSE are off)"
            )
        # Paid jobs left running (by this gateway before, or by one that died, now or
        # later): poll them again, send nothing.
        await self.fanout.resume(every=self.config.lease)
        await self.webhooks.start()  # before any job ends: the store matches its targets
        for raw in await self.store.backends():
            try:
                self.fleet.backend_lane(parse_spec(raw))
            except FleetError as exc:  # its name is a configured or managed backend's now
                log.warning("a backend added at run time is left out: %s", exc)
        # Of the backends, only those this gateway owns get a lane of the scheduler.
        owned = await self.owners.claim_at_start()
        if self.fleet.local is not None:
            self.scheduler.include(self.fleet.local)
        for name, lane in self.fleet.backends.items():
            if name in owned:
                self.scheduler.include(lane)
        await self.scheduler.start()
        await self.managed.start(self.scheduler)
        await self.owners.start()
        self._tasks.append(asyncio.create_task(self._retention(), name="retention"))
        self.serving = True

    async def _join(self) -> None:
        """Take this gateway's place among those sharing the store. The same id held by a
        process of this host that is gone (a restart after a crash) is taken over at
        once; one held elsewhere, or by a live process, refuses the start."""
        guard = self.scheduler.lease_guard
        sent_at = guard.now()
        try:
            await self.store.join(self.identity, self.config.lease)
        except GatewayIdInUse as refused:
            holder = refused.holder
            if holder.host != self.identity.host or process_alive(holder.pid):
                raise
            log.info("gateway %s: its earlier process %d is gone", holder.id, holder.pid)
            sent_at = guard.now()
            await self.store.join(self.identity, self.config.lease, replace=holder.instance)
        guard.renewed(sent_at)  # the lease runs from here

    async def validate(
        self, prompt: Any, targets: list[str] | None, tenant: str = DEFAULT_TENANT
    ) -> ValidationResult:
        """ComfyUI's validation against every node the fleet knows, with the files of
        `tenant`. A prompt only backends can run is judged by one that can and has the
        companion pack (the tenant's files it names pushed there first): its own node
        code (VALIDATE_INPUTS) decides, as ComfyUI's `POST /prompt` would."""
        folders = self.tenants.of(tenant)
        # Files it names that another gateway holds (an upload there) are brought here.
        values = await self._uploads.values(self.fleet.registry, prompt)
        if values:
            await self.peers.ensure(values, folders, tenant)
        with using_folders(folders):
            checked = await validate_prompt(self.fleet.registry, prompt, targets)
        # The shape and the classes are checked here either way; what node code decides
        # (a node's inputs) is the backend's to say.
        node_level = checked.ok or (checked.error or {}).get("type") == NODES_FAILED
        if not (node_level and self.fleet.runs_remotely(checked.prompt)):
            return checked
        verdict = await self.fleet.validate_on_backend(checked.prompt, targets, folders, tenant)
        if verdict is None:
            return checked
        ok, answer = verdict
        outputs = [o for o in answer.get("outputs", []) if o in checked.prompt] if ok else []
        error = None if ok else answer["error"]
        return replace(
            checked, ok=ok, error=error, outputs=outputs, node_errors=answer["node_errors"]
        )

    async def drain(self) -> None:
        """Stop taking work: running prompts get the grace period, sockets close."""
        self.serving = False
        await self.owners.stop()  # no backend is taken or let go from here on
        # Prompts re-queued at shutdown leave their paid jobs running for the next process.
        await self.scheduler.stop(self.config.shutdown_grace, self.fanout.detach_soon)
        await self.managed.stop()  # their prompts have ended or gone back to the queue
        try:
            await self.owners.release()  # another gateway may take its backends at once
            await self.store.leave()  # nothing of this gateway's is left running
        except StoreError as exc:
            log.warning("could not leave the store's gateways: %s", exc)
        await self.webhooks.stop()  # what it was sending is sent again by the next start
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.relay is not None:
            await self.relay.close()
        if self.events is not None:
            await self.events.close()  # the last events written; followers end
        await self.hub.close_all()

    async def close(self) -> None:
        """Release the store and threads, once no request can reach them."""
        await self.fanout.detach()
        await self.fleet.close()
        await self.peers.close()
        await self.peer_cancels.close()
        await self.store.close()
        self.engine.close()

    async def stop(self) -> None:
        await self.drain()
        await self.close()

    async def prune_once(self) -> int:
        """Apply the retention settings now; returns the number of files removed."""
        if self.events is not None:
            await self.events.prune()
        files = await self.store.prune_history(
            max_entries=self.config.history_max_entries,
            max_age_seconds=self.config.history_max_age,
        )
        if self.config.history_max_age:
            # Journaled paid results older than the history they served go too, but never
            # today's: the tenants' daily budgets count them.
            now = time.time()
            await self.store.prune_remote_jobs(
                min(now - self.config.history_max_age, day_start(now))
            )

        def remove() -> int:
            tenants = {item.tenant for item in files}
            return sum(
                remove_files(self.tenants.of(t), [f for f in files if f.tenant == t])
                for t in tenants
            )

        removed = await asyncio.to_thread(remove)
        # Copies of other gateways' files fetched here: their history may have gone there.
        fetched = await prune_copies(
            self.store, self.tenants, self.config.history_max_age, time.time()
        )
        return removed + fetched

    async def _retention(self) -> None:
        while True:
            try:
                await self.prune_once()
            except Exception:
                log.exception("retention failed")
            await asyncio.sleep(60)


def shared_store(config: ServerConfig) -> bool:
    """Whether other gateways may share the store (PostgreSQL; a SQLite file has one)."""
    return isinstance(config.store, str) and is_postgres_url(config.store)


def _recounter(scheduler: Scheduler, router: ClientRouter) -> Callable[[], Awaitable[None]]:
    """Read the queue's size from the store and send it (a `status` frame). Callers that
    ask while a count is read share the next one (read after they asked): one count at a
    time, however many prompts end at once."""
    next_count: asyncio.Future[None] | None = None
    counting = asyncio.Lock()

    async def count() -> None:
        nonlocal next_count
        async with counting:
            next_count = None  # who asks from now on waits for the count after this one
            try:
                await scheduler.recount()
            except StoreError as exc:  # the count held so far is sent
                log.warning("cannot count the queue: %s", exc)

    async def recount() -> None:
        nonlocal next_count
        if next_count is None:
            next_count = asyncio.ensure_future(count())
        await asyncio.shield(next_count)
        router.queue_changed(scheduler.queue_remaining)

    return recount


def fanout_settings(config: ServerConfig) -> FanoutSettings:
    return FanoutSettings(
        image=PoolSize(config.image_concurrency, config.image_pending),
        video=PoolSize(config.video_concurrency, config.video_pending),
    )


def webhook_settings(config: ServerConfig) -> WebhookSettings:
    host = config.host if ":" not in config.host else f"[{config.host}]"
    return WebhookSettings(
        targets=config.webhooks,
        key=None if config.webhooks_secret is None else parse_secret(config.webhooks_secret),
        allow_private=config.webhooks_allow_private,
        timeout=config.webhooks_timeout,
        retry_for=config.webhooks_retry_for,
        concurrency=config.webhooks_concurrency,
        view_base=(config.public_url or f"http://{host}:{config.port}").rstrip("/"),
    )


GATEWAY = web.AppKey("gateway", Gateway)
