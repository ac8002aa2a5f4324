"""The sender: takes due deliveries from the store's outbox and posts them, signed.

Woken when a job's end is recorded (the scheduler's `job_finished`), and every second
for retries, for ends recorded elsewhere (a cancelled pending job, another gateway on
the same PostgreSQL) and for what an earlier process left. Each claimed delivery is
leased in the store, so two senders never send one at the same moment; a sender that
dies holding one leaves it to the next claim once the lease ends (at least once). Each
attempt has its own timeout and at most `concurrency` run at once, at most a quarter of
them to one destination (a target, or a prompt URL's host). A claimed delivery whose
destination is busy waits for it, up to three times as many as it has slots; beyond
that, it is given back for a moment (for one timeout when the destination has finished
no attempt for a second: it hangs). So a receiver that hangs holds a few slots for one
timeout each, and delays nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable

import aiohttp

from comfyfleet.domain.jobs import Job, JobResult
from comfyfleet.domain.webhooks import DeliveryAttempt, WebhookDelivery
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.store.base import JobStore, StoreError
from comfyfleet.webhooks import body
from comfyfleet.webhooks.addresses import NotAllowed, PublicResolver, check_literal, parse_url
from comfyfleet.webhooks.settings import WebhookSettings
from comfyfleet.webhooks.signing import headers

log = logging.getLogger(__name__)

#: Seconds between looks at the outbox when nothing wakes the sender.
POLL = 1.0
#: Deliveries held for a busy destination, per slot it has: each waits at most this many
#: attempts' time, and its lease lasts one more (and a margin to record the attempt).
WAITING_PER_SLOT, LEASE_MARGIN = 3, 5.0
#: Retries wait 1 s, 2 s, 4 s ... at most 30 min (with jitter), within the retry window.
FIRST_RETRY, LONGEST_RETRY = 1.0, 1800.0
#: Bytes of a receiver's answer read (the rest is never read); characters kept of it.
MAX_RESPONSE, ERROR_CHARS = 64 * 1024, 200
#: Delivered and dead deliveries are deleted this long after their last change.
KEEP_FINISHED, PRUNE_EVERY = 7 * 86400.0, 3600.0

_redact = Redactor()


class WebhookSender(JobObserver):
    """Delivers the outbox. `sent`, `failed_attempts` and `dead_lettered` count since start."""

    def __init__(
        self,
        store: JobStore,
        settings: WebhookSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self._clock = clock
        self._targets = {config.target.name: config for config in settings.targets}
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._per_destination: Counter[str] = Counter()
        self._waiting: dict[str, deque[WebhookDelivery]] = {}
        self._progress: dict[str, float] = {}  # destination -> its last attempt's end
        self._destination_cap = max(1, settings.concurrency // 4)
        self._task: asyncio.Task[None] | None = None
        self._sessions: dict[bool, aiohttp.ClientSession] = {}
        self.sent = 0
        self.failed_attempts = 0
        self.dead_lettered = 0

    def job_finished(self, job: Job, result: JobResult) -> None:
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        """Mirror the targets into the store (every gateway of a shared store should have
        the same ones) and start sending, when anything can be sent."""
        await self.store.set_webhook_targets([config.target for config in self.settings.targets])
        if not self.settings.enabled:
            return
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout)
        for public_only in (True, False):
            connector = aiohttp.TCPConnector(
                limit=self.settings.concurrency,
                resolver=PublicResolver() if public_only else None,
                use_dns_cache=False,  # each attempt checks what the name resolves to now
            )
            self._sessions[public_only] = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False
            )
        self._task = asyncio.create_task(self._run(), name="webhook-sender")

    async def stop(self) -> None:
        """Stop sending: attempts under way are abandoned (their leases end, and a later
        claim sends them again)."""
        self._waiting.clear()  # held deliveries: their leases end too
        tasks = [t for t in (self._task, *self._inflight) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        pruned = 0.0
        while True:
            self._wake.clear()
            free = self.settings.concurrency - len(self._inflight)
            claimed: list[WebhookDelivery] = []
            try:
                if free > 0:
                    # Time to wait for its destination, then for its own attempt.
                    lease = (WAITING_PER_SLOT + 1) * self.settings.timeout + LEASE_MARGIN
                    claimed = await self.store.claim_webhook_deliveries(free, lease)
                if self._clock() - pruned > PRUNE_EVERY:
                    await self.store.prune_webhook_deliveries(self._clock() - KEEP_FINISHED)
                    pruned = self._clock()
            except StoreError as exc:
                log.warning("webhook outbox unavailable: %s", exc)
            taken = await self._start_all(claimed)
            if claimed and len(claimed) == free and taken:
                continue  # more may be due
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # lands as the wake-up does, and `stop` would wait for this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL):
                    await self._wake.wait()

    async def _start_all(self, claimed: list[WebhookDelivery]) -> int:
        """Start an attempt for each delivery whose destination has room, hold some for
        when it has, give the rest back (see the module doc). Returns how many it took on."""
        taken = 0
        for delivery in claimed:
            where = _destination_key(delivery)
            waiting = self._waiting.setdefault(where, deque())
            if self._per_destination[where] < self._destination_cap:
                self._start(where, delivery)
            elif len(waiting) < WAITING_PER_SLOT * self._destination_cap:
                waiting.append(delivery)
            else:
                stalled = self._clock() - self._progress.get(where, 0.0) > POLL
                later = self._clock() + (self.settings.timeout if stalled else POLL / 10)
                with contextlib.suppress(StoreError):
                    await self.store.release_webhook_delivery(
                        delivery.id, delivery.lease or "", later
                    )
                continue
            taken += 1
        return taken

    def _start(self, where: str, delivery: WebhookDelivery) -> None:
        if not self._per_destination[where]:
            self._progress[where] = self._clock()  # idle until now: not stalled
        self._per_destination[where] += 1
        task = asyncio.create_task(self._deliver(delivery))
        self._inflight.add(task)
        task.add_done_callback(functools.partial(self._done, where))

    def _done(self, where: str, task: asyncio.Task[None]) -> None:
        self._progress[where] = self._clock()
        self._per_destination[where] -= 1
        self._inflight.discard(task)
        waiting = self._waiting.get(where)
        if waiting:
            self._start(where, waiting.popleft())
        else:
            self._waiting.pop(where, None)
            if not self._per_destination[where]:
                del self._per_destination[where]
                del self._progress[where]
        self._wake.set()  # a slot is free
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook delivery failed", exc_info=task.exception())

    # -- one delivery --------------------------------------------------------------------

    async def _deliver(self, delivery: WebhookDelivery) -> None:
        payload = delivery.body or await self._body(delivery)
        attempt = await self._attempt(delivery, payload)
        if attempt.delivered:
            self.sent += 1
        else:
            self.failed_attempts += 1
            if attempt.next_at is None:
                self.dead_lettered += 1
            log.warning(
                "webhook %s for %s (%s) failed: %s%s",
                delivery.id,
                delivery.prompt_id,
                delivery.target or "its webhook_url",
                attempt.error,
                "" if attempt.next_at is not None else "; dead-lettered",
            )
        try:
            await self.store.record_webhook_attempt(delivery.id, delivery.lease or "", attempt)
        except StoreError as exc:  # its lease ends, and it is sent again
            log.warning("could not record webhook %s: %s", delivery.id, exc)

    async def _body(self, delivery: WebhookDelivery) -> str:
        job = await self.store.get(delivery.prompt_id)
        entry = await self.store.history_entry(delivery.prompt_id) if job else None
        return body.build(delivery, job, entry, self.settings.view_base)

    async def _attempt(self, delivery: WebhookDelivery, payload: str) -> DeliveryAttempt:
        try:
            url, key, public_only = self._destination(delivery)
        except NotAllowed as exc:  # only a config change helps: dead at once
            return DeliveryAttempt(False, payload, error=str(exc))
        data = payload.encode()
        signed = headers(key, delivery.id, int(self._clock()), data)
        session = self._sessions[public_only]
        try:
            async with session.post(
                url,
                data=data,
                headers={**signed, "Content-Type": "application/json"},
                allow_redirects=False,
            ) as response:
                answer = await response.content.read(MAX_RESPONSE)
                status = response.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = _redact.text(f"{type(exc).__name__}: {exc}".strip(": "))
            return DeliveryAttempt(False, payload, error=error, next_at=self._next_try(delivery))
        if 200 <= status < 300:
            return DeliveryAttempt(True, payload, status)
        text = answer[:ERROR_CHARS].decode("utf-8", "replace")
        error = f"HTTP {status}: " + "".join(c if c.isprintable() else " " for c in text)
        return DeliveryAttempt(False, payload, status, error.strip(), self._next_try(delivery))

    def _destination(self, delivery: WebhookDelivery) -> tuple[str, bytes, bool]:
        """(url, key, public addresses only) of a delivery, or NotAllowed."""
        if delivery.target is not None:  # an operator's target: wherever it points now
            config = self._targets.get(delivery.target)
            if config is None:
                raise NotAllowed(f"webhook target {delivery.target} is no longer configured")
            return config.target.url, config.key, False
        if self.settings.key is None:
            raise NotAllowed("no webhooks_secret is set to sign a prompt's own webhook")
        host = parse_url(delivery.url).hostname or ""
        if not self.settings.allow_private:
            check_literal(host)
        return delivery.url, self.settings.key, not self.settings.allow_private

    def _next_try(self, delivery: WebhookDelivery) -> float | None:
        """When to try again after a failed attempt; None once the retry window is over."""
        now = self._clock()
        ends = delivery.retry_since + self.settings.retry_for
        if now >= ends:
            return None
        delay = min(LONGEST_RETRY, FIRST_RETRY * 2 ** min(delivery.attempts, 20))
        return float(min(ends, now + delay * random.uniform(0.8, 1.0)))


def _destination_key(delivery: WebhookDelivery) -> str:
    """Who answers a delivery: its target, or its URL's host."""
    if delivery.target is not None:
        return "target:" + delivery.target
    try:
        return "host:" + (parse_url(delivery.url).hostname or "")
    except NotAllowed:
        return "host:"
