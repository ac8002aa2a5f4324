"""What a validated prompt would send: its paid jobs, read from the graph before it runs.

A paid node is a provider node (its class has `PAID_JOB`, a `PaidJobSpec`) or its
Concurrent Submit twin, upstream of an output. Each sends one job, except:

- equal nodes (the same class and inputs, upstream too) share one job, as they do
  when the prompt runs;
- a node fed a list (an upstream `OUTPUT_IS_LIST`, e.g. Rebatch Images) runs once per
  item: how many is known only when it runs, so its count is unknown.

Each job also gets its request's hash when the prompt alone makes the request (see
reuse.py), so a job the journal would reuse or wait on is told apart from a new one. A
model given through a link is known only when it runs (its cost: unknown).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from comfyfleet.domain.budgets import Usage
from comfyfleet.engine.nodedef import NodeDef
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.protocol.prompt import is_link
from comfyfleet.spend.prices import PaidJob, PaidJobSpec, PriceTable
from comfyfleet.spend.reuse import request_hash


@dataclass(frozen=True)
class PlannedJob:
    node_ids: tuple[str, ...]  # the nodes that share this job
    provider: str
    model: str | None  # None: given through a link
    units: float
    cost: float | None  # None: no price, or the model is not known yet
    terms_known: bool = True  # model and seconds given in the prompt, not through links
    request_hash: str | None = None  # None: the request is made only as it runs


@dataclass(frozen=True)
class Estimate:
    jobs: tuple[PlannedJob, ...]  # new jobs: what the prompt pays for
    uncounted: tuple[str, ...]  # paid nodes whose number of jobs is not known
    #: Jobs the journal holds already (a kept result, or a live job): none is sent.
    reused: tuple[PlannedJob, ...] = ()

    @property
    def known(self) -> bool:
        """Whether the number of jobs is known before the prompt runs."""
        return not self.uncounted

    @property
    def costs_known(self) -> bool:
        """Whether every job's model (and seconds) is in the prompt: its cost is then
        known, or known to have no price."""
        return all(job.terms_known for job in self.jobs)

    @property
    def usage(self) -> Usage:
        return Usage(
            len(self.jobs),
            sum(job.cost or 0.0 for job in self.jobs),
            sum(1 for job in self.jobs if job.cost is None),
        )

    def as_json(self) -> dict[str, Any]:
        """The dry run's answer: jobs grouped by provider and model, and the totals."""
        usage = self.usage
        return {
            "paid_jobs": usage.paid_jobs,
            "count_known": self.known,
            "uncounted_nodes": list(self.uncounted),
            "cost": None if usage.unpriced else round(usage.spend, 6),
            "priced_cost": round(usage.spend, 6),
            "unpriced_jobs": usage.unpriced,
            "currency": "USD",
            "jobs": _groups(self.jobs),
            "reused_jobs": len(self.reused),
            "reused": _groups(self.reused),
        }


def _groups(jobs: tuple[PlannedJob, ...]) -> list[dict[str, Any]]:
    by_model: dict[tuple[str, str | None], list[PlannedJob]] = {}
    for job in jobs:
        by_model.setdefault((job.provider, job.model), []).append(job)
    return [_group(provider, model, group) for (provider, model), group in by_model.items()]


def _group(provider: str, model: str | None, jobs: list[PlannedJob]) -> dict[str, Any]:
    costs = [job.cost for job in jobs]
    priced = None if any(c is None for c in costs) else sum(c or 0.0 for c in costs)
    return {
        "provider": provider,
        "model": model,
        "count": len(jobs),
        "cost": None if priced is None else round(priced, 6),
        "nodes": sorted(node for job in jobs for node in job.node_ids),
    }


def estimate(
    prompt: dict[str, Any], outputs: list[str], registry: NodeRegistry, prices: PriceTable
) -> Estimate:
    """The paid jobs of a validated prompt, run for `outputs`."""
    graph = _Graph(prompt, registry, outputs)
    shared: dict[str, list[str]] = {}
    specs: dict[str, tuple[PaidJobSpec, NodeDef, type]] = {}
    uncounted: list[str] = []
    for node_id in graph.order:
        found = graph.paid_spec(node_id)
        if found is None:
            continue
        if graph.fed_a_list(node_id):
            uncounted.append(node_id)
            continue
        specs[node_id] = found
        shared.setdefault(graph.identity(node_id), []).append(node_id)
    jobs = []
    for node_ids in shared.values():
        spec, node, source = specs[node_ids[0]]
        job = _planned(tuple(node_ids), spec, node, prompt[node_ids[0]], prices)
        digest = request_hash(prompt, node_ids[0], source, registry)
        jobs.append(dataclasses.replace(job, request_hash=digest))
    return Estimate(tuple(jobs), tuple(sorted(uncounted)))


class KnownRequests(Protocol):
    async def known_requests(self, hashes: Sequence[str]) -> set[str]: ...


async def without_reused(planned: Estimate, journal: KnownRequests) -> Estimate:
    """`planned` with the jobs the journal holds (a kept result, a live job) moved to its
    `reused`: the run sends no new job for them."""
    hashes = [job.request_hash for job in planned.jobs if job.request_hash is not None]
    if not hashes:
        return planned
    known = await journal.known_requests(hashes)
    fresh = tuple(job for job in planned.jobs if job.request_hash not in known)
    held = tuple(job for job in planned.jobs if job.request_hash in known)
    return dataclasses.replace(planned, jobs=fresh, reused=planned.reused + held)


def _planned(
    node_ids: tuple[str, ...],
    spec: PaidJobSpec,
    node: NodeDef,
    entry: dict[str, Any],
    prices: PriceTable,
) -> PlannedJob:
    model = _widget(entry, node, spec.model_input)
    seconds = None if spec.seconds_input is None else _widget(entry, node, spec.seconds_input)
    try:
        units = 1.0 if seconds is None else float(seconds)
    except (TypeError, ValueError):
        units = 1.0
    if not isinstance(model, str):
        return PlannedJob(node_ids, spec.provider, None, units, None, terms_known=False)
    if spec.seconds_input is not None and seconds is None:  # known only when it runs
        return PlannedJob(node_ids, spec.provider, model, units, None, terms_known=False)
    cost = prices.cost(PaidJob(spec.provider, model, units))
    return PlannedJob(node_ids, spec.provider, model, units, cost)


def _widget(entry: dict[str, Any], node: NodeDef, name: str) -> Any:
    """A widget's value as the prompt gives it (its default when left out); None when it
    comes through a link."""
    inputs = entry.get("inputs") or {}
    if name in inputs:
        value = inputs[name]
        return None if is_link(value) else value
    info = node.input_types().get(name)
    return None if info is None else info.options.get("default")


class _Graph:
    """The nodes the outputs need, each with whether its outputs are lists and what it
    asks for (computed upstream first, without recursion: prompts may be deep)."""

    def __init__(self, prompt: dict[str, Any], registry: NodeRegistry, outputs: list[str]):
        self.prompt = prompt
        self.registry = registry
        self.order = self._upstream_first(outputs)
        self._lists: dict[str, tuple[bool, ...]] = {}
        self._identities: dict[str, str] = {}
        for node_id in self.order:
            self._lists[node_id] = self._list_outputs(node_id)
            self._identities[node_id] = self._identity(node_id)

    def node(self, node_id: str) -> NodeDef | None:
        return self.registry.get(str(self.prompt[node_id].get("class_type")))

    def paid_spec(self, node_id: str) -> tuple[PaidJobSpec, NodeDef, type] | None:
        """The node's spec, its definition, and the class that makes its request (the
        original of a Concurrent Submit twin); None for a node that sends no paid job."""
        node = self.node(node_id)
        if node is None:
            return None
        original = getattr(node.cls, "ORIGINAL_NODE", None)  # a Concurrent Submit twin
        source = self.registry.get(original) if isinstance(original, str) else node
        if source is None:
            return None
        spec = getattr(source.cls, "PAID_JOB", None)
        return (spec, node, source.cls) if isinstance(spec, PaidJobSpec) else None

    def fed_a_list(self, node_id: str) -> bool:
        """Whether the node runs once per item of a list input (more than once, maybe)."""
        node = self.node(node_id)
        return node is not None and not node.input_is_list and self._fed(node_id)

    def identity(self, node_id: str) -> str:
        return self._identities[node_id]

    def _upstream_first(self, outputs: list[str]) -> list[str]:
        order: list[str] = []
        state: dict[str, bool] = {}  # False: entered, True: done
        for root in outputs:
            stack: list[tuple[str, bool]] = [(root, False)]
            while stack:
                node_id, leaving = stack.pop()
                if leaving:
                    state[node_id] = True
                    order.append(node_id)
                    continue
                if node_id in state or node_id not in self.prompt:
                    continue  # done, or on the path (a cycle, refused by validation)
                state[node_id] = False
                stack.append((node_id, True))
                stack.extend((source, False) for source, _ in self._links(node_id))
        return order

    def _fed(self, node_id: str) -> bool:
        return any(self._is_list(source, slot) for source, slot in self._links(node_id))

    def _is_list(self, node_id: str, slot: int) -> bool:
        flags = self._lists.get(node_id, ())
        return slot < len(flags) and flags[slot]

    def _list_outputs(self, node_id: str) -> tuple[bool, ...]:
        node = self.node(node_id)
        if node is None:
            return ()
        fed = not node.input_is_list and self._fed(node_id)
        return tuple(fed or flag for flag in node.output_is_list)

    def _identity(self, node_id: str) -> str:
        """Equal for nodes that ask for the same job: the class a twin stands for, and
        the inputs, links compared by what they come from."""
        entry = self.prompt[node_id]
        node = self.node(node_id)
        original = getattr(node.cls, "ORIGINAL_NODE", None) if node is not None else None
        inputs = {
            name: ["link", self._identities.get(value[0], value[0]), value[1]]
            if is_link(value)
            else value
            for name, value in (entry.get("inputs") or {}).items()
        }
        text = json.dumps(
            [original or entry.get("class_type"), inputs], sort_keys=True, default=str
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def _links(self, node_id: str) -> list[tuple[str, int]]:
        inputs = self.prompt.get(node_id, {}).get("inputs") or {}
        return [(str(v[0]), int(v[1])) for v in inputs.values() if is_link(v)]
