"""The state of the gateway as it is at scrape time, read from the parts that hold it.

Nothing is copied in between scrapes: the store's counts (one read, before the
answer is written), the fleet's backends, the scheduler's lanes, the WebSocket hub,
the fan-out service's tasks and provider cooldowns, the webhook sender's counts, and
the store's commit times.
Every family is written even when it has no sample yet, so a dashboard's queries
name families that exist from the first scrape on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from comfyfleet import __version__
from comfyfleet.domain.budgets import Usage
from comfyfleet.domain.jobs import JobStatus
from comfyfleet.scheduler.fair_share import TenantShare
from comfyfleet.server.admin.fleet_api import backend_up
from comfyfleet.server.admin.metrics.labels import BoundedLabel, clean
from comfyfleet.server.gateway import Gateway
from comfyfleet.store.commit_times import CommitTally

#: Distinct backends, lanes and providers given their own series; the rest are `other`.
MAX_SERIES = 200
Family = GaugeMetricFamily | CounterMetricFamily
#: The queue's states, as the store counts them.
QUEUED = (JobStatus.PENDING, JobStatus.RUNNING)


class LiveCollector(Collector):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._counts: dict[JobStatus, int] = {}
        self._backend = BoundedLabel(MAX_SERIES)
        self._lane = BoundedLabel(MAX_SERIES)
        self._provider = BoundedLabel(MAX_SERIES)
        self._tenant = BoundedLabel(MAX_SERIES)
        self._tenants: list[TenantShare] = []
        self._spent: dict[str, Usage] = {}
        #: More families, from other parts (the workers' demand), given the store's counts.
        self.more: list[Callable[[Mapping[JobStatus, int]], Iterator[Metric]]] = []

    async def refresh(self) -> None:
        """Read what needs a store read (before `collect`, which cannot wait)."""
        self._counts = await self.gateway.store.counts()
        self._tenants = await self.gateway.scheduler.shares.current()
        self._spent = await self.gateway.spend_today.of(t.tenant for t in self._tenants)

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "comfyfleet_build_info", "The running version.", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info
        yield from self._queue()
        yield from self._tenant_shares()
        yield from self._lanes()
        yield from self._backends()
        yield from self._websockets()
        yield from self._fanout()
        yield from self._webhooks()
        for more in self.more:
            yield from more(self._counts)
        yield _histogram(
            "comfyfleet_store_commit_seconds",
            "Time of each store write until committed (SQLite: one group commit of the "
            "writes queued together; PostgreSQL: one write).",
            self.gateway.store.commit_times.tally(),
        )

    def _queue(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily(
            "comfyfleet_queue_jobs",
            "Prompts in the queue by status (pending, running), as the store counts them "
            "(with a shared PostgreSQL store: every gateway's).",
            labels=["status"],
        )
        for status in QUEUED:
            queue.add_metric([status.value], self._counts.get(status, 0))
        yield queue

    def _tenant_shares(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "comfyfleet_tenant_jobs",
            "Prompts of each tenant in the queue by status (pending: those a slot may "
            "claim; running), fleet-wide.",
            labels=["tenant", "status"],
        )
        share = GaugeMetricFamily(
            "comfyfleet_tenant_share",
            "Each tenant's part (0 to 1) of all tenants' use of this gateway's slots, in "
            "slot-seconds fading over the fair-share window.",
            labels=["tenant"],
        )
        paid = GaugeMetricFamily(
            "comfyfleet_tenant_paid_jobs_today",
            "Paid API jobs each tenant's prompts sent since 00:00 UTC, fleet-wide (what its "
            "paid_jobs_per_day counts).",
            labels=["tenant"],
        )
        spend = GaugeMetricFamily(
            "comfyfleet_tenant_spend_today_dollars",
            "What those jobs cost by the price table, in US dollars (what spend_per_day "
            "counts; jobs without a price are left out).",
            labels=["tenant"],
        )
        # label -> pending, running, share, paid jobs, spend
        totals: dict[str, list[float]] = {}
        for item in self._tenants:
            sums = totals.setdefault(self._tenant(item.tenant), [0.0] * 5)
            used = self._spent.get(item.tenant, Usage())
            for n, value in enumerate(
                (item.pending, item.running, item.share, used.paid_jobs, used.spend)
            ):
                sums[n] += value
        for label, (pending, running, part, jobs_today, dollars) in totals.items():
            jobs.add_metric([label, "pending"], pending)
            jobs.add_metric([label, "running"], running)
            share.add_metric([label], part)
            paid.add_metric([label], jobs_today)
            spend.add_metric([label], dollars)
        yield from (jobs, share, paid, spend)

    def _lanes(self) -> Iterator[Metric]:
        scheduler = self.gateway.scheduler
        slots = GaugeMetricFamily(
            "comfyfleet_lane_slots", "Prompts a lane runs at once.", labels=["lane"]
        )
        running = GaugeMetricFamily(
            "comfyfleet_lane_running_jobs",
            "Prompts running on a lane now (on a backend: sent to it, its queue included).",
            labels=["lane"],
        )
        for lane in scheduler.lanes:
            name = self._lane(lane.name)
            slots.add_metric([name], lane.slots)
            running.add_metric([name], len(scheduler.runs_on(lane.name)))
        yield slots
        yield running

    def _backends(self) -> Iterator[Metric]:
        help_ = {
            "up": "1 when the ComfyUI backend is connected and takes work (draining or not).",
            "suspect": "1 when the backend hung on a prompt and gets no more until it answers.",
            "draining": "1 when the backend is draining: it takes no new prompts.",
        }
        families = {
            state: GaugeMetricFamily(f"comfyfleet_backend_{state}", text, labels=["backend"])
            for state, text in help_.items()
        }
        owners = self.gateway.owners
        for name, lane in list(self.gateway.fleet.backends.items()):
            if not owners.owns(lane.spec.name):
                continue  # the gateway that dispatches to it reports it
            label = [self._backend(name)]
            families["up"].add_metric(label, int(backend_up(lane)))
            families["suspect"].add_metric(label, int(lane.suspect))
            families["draining"].add_metric(label, int(lane.draining))
        yield from families.values()

    def _websockets(self) -> Iterator[Metric]:
        hub = self.gateway.hub
        yield GaugeMetricFamily(
            "comfyfleet_websocket_clients", "WebSocket clients connected.", value=hub.count()
        )
        yield CounterMetricFamily(
            "comfyfleet_websocket_dropped",
            "WebSocket clients dropped for falling too far behind.",
            value=hub.dropped,
        )

    def _fanout(self) -> Iterator[Metric]:
        fanout = self.gateway.fanout
        live = GaugeMetricFamily(
            "comfyfleet_fanout_jobs",
            "Fan-out jobs (paid API jobs) in the pools now, by provider and state "
            "(queued, running).",
            labels=["provider", "state"],
        )
        now = Counter((task.info.provider, task.state.value) for task in list(fanout.tasks))
        ended = CounterMetricFamily(
            "comfyfleet_fanout_jobs_ended",
            "Fan-out jobs ended, by provider and final state (success, skipped_error, "
            "failed, cancelled).",
            labels=["provider", "state"],
        )
        reused = CounterMetricFamily(
            "comfyfleet_fanout_journal_reuses",
            "Fan-out results taken from the journal instead of a new paid job, by provider.",
            labels=["provider"],
        )
        limited = CounterMetricFamily(
            "comfyfleet_provider_rate_limited",
            "HTTP 429 answers from providers, by provider.",
            labels=["provider"],
        )
        cooldowns = CounterMetricFamily(
            "comfyfleet_provider_cooldowns",
            "Pauses of every request to a provider's endpoint and key after its 429s.",
            labels=["provider"],
        )
        limits = fanout.rate_limits()
        self._fill(live, {key: n for key, n in now.items()})
        self._fill(ended, {key: n for key, n in fanout.ended.items()})
        self._fill(reused, {(p,): n for p, n in fanout.reused.items()})
        self._fill(limited, {(p,): n for p, (n, _) in limits.items()})
        self._fill(cooldowns, {(p,): n for p, (_, n) in limits.items()})
        yield from (live, ended, reused, limited, cooldowns)

    def _fill(self, family: Family, values: Mapping[tuple[str, ...], int]) -> None:
        """One sample per (provider, ...) label set; providers past the limit as one."""
        merged: Counter[tuple[str, ...]] = Counter()
        for (provider, *rest), count in values.items():
            merged[(self._provider(provider), *map(clean, rest))] += count
        for labels, count in merged.items():
            family.add_metric(list(labels), count)

    def _webhooks(self) -> Iterator[Metric]:
        sender = self.gateway.webhooks
        attempts = CounterMetricFamily(
            "comfyfleet_webhook_deliveries",
            "Webhook delivery attempts, by result: delivered (a 2xx answer), failed "
            "(anything else: retried later, or dead-lettered).",
            labels=["result"],
        )
        attempts.add_metric(["delivered"], sender.sent)
        attempts.add_metric(["failed"], sender.failed_attempts)
        yield attempts
        yield CounterMetricFamily(
            "comfyfleet_webhook_dead_letters",
            "Webhook deliveries given up on after their retry window (kept on the "
            "dead-letter list, retried by id).",
            value=sender.dead_lettered,
        )


def _histogram(name: str, documentation: str, tally: CommitTally) -> HistogramMetricFamily:
    buckets, cumulative = [], 0
    for bound, count in zip((*map(str, tally.bounds), "+Inf"), tally.counts, strict=True):
        cumulative += count
        buckets.append((bound, float(cumulative)))
    return HistogramMetricFamily(
        name, documentation, buckets=buckets, sum_value=tally.total_seconds
    )
