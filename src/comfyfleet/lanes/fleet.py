"""The fleet: the local lane plus every ComfyUI backend, and what they can run together."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import socket
from collections.abc import Mapping
from typing import Any

import aiohttp

from comfyfleet.domain.backend_names import NAME, FleetError
from comfyfleet.engine.executor import Engine
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.folders import Folders, using_folders
from comfyfleet.lanes.backend import BackendClient, BackendError, BackendSpec, FileAnswer
from comfyfleet.lanes.base import Lane
from comfyfleet.lanes.capabilities import Capabilities, KnownCapabilities
from comfyfleet.lanes.comfyui import ComfyUILane
from comfyfleet.lanes.local import LocalLane
from comfyfleet.lanes.remote_nodes import union_registry
from comfyfleet.lanes.settings import LaneSettings
from comfyfleet.lanes.submits import Submits
from comfyfleet.lanes.uploads import FetchInputs
from comfyfleet.spend.holds import BackendBudgets
from comfyfleet.tenants import TenantFolders

log = logging.getLogger(__name__)

VIEW_PARAMS = ("filename", "subfolder", "type", "preview", "channel")
#: Whitespace and control characters, spelled out: `\s` differs between Python and the
#: ECMA regexes of docs/openapi.json, which repeats URL.
_BLANK = r"\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
#: A backend's url (trailing slashes are dropped first).
URL = re.compile(rf"^https?://[^/{_BLANK}]+(/[^{_BLANK}]*)?$")


#: Most slots (and most prefetch) one backend may declare.
MAX_SLOTS = 1024


def _is_header(value: Any) -> bool:
    return isinstance(value, str) and ":" in value


def parse_spec(raw: Any) -> BackendSpec:
    """A backend from config or the admin API.

    `{url, name?, slots?, prefetch?, tags?, auth_header?}`, or just the url."""
    if isinstance(raw, str):
        raw = {"url": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
        raise FleetError("a backend needs a url")
    url = raw["url"].rstrip("/")
    if not URL.fullmatch(url):
        raise FleetError(f"not an http(s) url: {url!r}")
    name = raw.get("name")
    if name is None or name == "":
        name = derived_name(url)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise FleetError(f"bad backend name {name!r}: letters, digits, . _ - (max 64)")
    slots, prefetch = _as_int(raw.get("slots", 1)), _as_int(raw.get("prefetch", 0))
    # Bounded: the scheduler starts one task per slot (slots + prefetch) of a lane.
    if (
        slots is None
        or prefetch is None
        or not (1 <= slots <= MAX_SLOTS and 0 <= prefetch <= MAX_SLOTS)
    ):
        raise FleetError(f"slots must be an integer 1..{MAX_SLOTS} and prefetch 0..{MAX_SLOTS}")
    tags = raw.get("tags", [])
    auth = raw.get("auth_header")
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise FleetError("tags must be a list of strings")
    if auth is not None and not _is_header(auth):
        raise FleetError("auth_header must read 'Name: value'")
    return BackendSpec(url, name, slots, prefetch, tuple(tags), auth)


def derived_name(url: str) -> str:
    """The name of a backend defined without one: its url's host and path, made a name.

    Characters a name cannot hold become `-`; a name that would still be refused (too
    long, or not starting with a letter or digit) is trimmed, and `backend` stands in
    for a url with no letter or digit at all.
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "-", url.split("://", 1)[1])
    if NAME.fullmatch(name):
        return name
    return name.lstrip("._-")[:64] or "backend"


def _as_int(value: Any) -> int | None:
    """An integer as JSON has them (`2` or `2.0`); None for anything else, booleans included."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def spec_json(spec: BackendSpec, *, secrets: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "url": spec.url,
        "name": spec.name,
        "slots": spec.slots,
        "prefetch": spec.prefetch,
        "tags": list(spec.tags),
    }
    if spec.auth_header:
        header = spec.auth_header.partition(":")[0]
        data["auth_header"] = spec.auth_header if secrets else f"{header}: ***"
    return data


class Fleet:
    def __init__(
        self,
        engine: Engine,
        tenants: TenantFolders,
        local_slots: int,
        settings: LaneSettings,
        fetch_inputs: FetchInputs | None = None,
        *,
        agent: str | None = None,
        budgets: BackendBudgets | None = None,
    ):
        self.engine = engine
        self.tenants = tenants
        self.folders = tenants.default
        self.settings = settings
        self.fetch_inputs = fetch_inputs  # prompts' files another gateway holds
        self.local = (
            LocalLane(engine, local_slots, tenants=tenants, fetch_inputs=fetch_inputs)
            if local_slots
            else None
        )
        self.backends: dict[str, ComfyUILane] = {}
        self.registry: NodeRegistry = engine.registry
        self._session: aiohttp.ClientSession | None = None
        self._submits = Submits()
        self._agent = agent  # the User-Agent backends see (None: aiohttp's)
        self._budgets = budgets  # paid-job budgets of the prompts sent to backends
        self._known = KnownCapabilities()  # shared by the backends' lanes
        self._rebuilding: asyncio.Task[None] | None = None
        # Workers may join at any time (comfyfleet.server.workers): a prompt no lane can
        # run now waits for one, as it waits for a slot.
        self.awaits_workers = False
        # What workers connected to other gateways of a shared store run (see
        # comfyfleet.server.workers.shared_nodes): in the node union, and runnable.
        self.elsewhere: list[Capabilities] = []
        self._again = False  # a lane changed while the union was being built

    def lanes(self) -> list[Lane]:
        lanes: list[Lane] = [self.local] if self.local else []
        return lanes + list(self.backends.values())

    def _client_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=64)
            headers = {"User-Agent": self._agent} if self._agent else None
            self._session = aiohttp.ClientSession(connector=connector, headers=headers)
        return self._session

    def backend_lane(self, spec: BackendSpec) -> ComfyUILane:
        """A lane for `spec`, known to the fleet (the scheduler starts it)."""
        if spec.name in self.backends:
            raise FleetError(f"backend {spec.name} already exists")
        client = BackendClient(spec, self._client_session(), self._client_id(spec))
        lane = ComfyUILane(
            client, self.folders, self.settings, self.tenants, self._submits, self.fetch_inputs
        )
        lane.on_change = self.rebuild
        lane.known = self._known
        lane.services = self.engine.services
        if self._budgets is not None:
            lane.holds = self._budgets.on(spec.name, lane.fetch_json)
        self.backends[spec.name] = lane
        return lane

    def _client_id(self, spec: BackendSpec) -> str:
        """The same for this gateway (host, data folders) and backend after every restart:
        what a backend's first owner records as its client id for the whole fleet (see
        comfyfleet.server.backend_owners)."""
        key = f"{socket.gethostname()}\0{self.folders.output}\0{spec.name}"
        return f"comfyfleet-{hashlib.sha256(key.encode()).hexdigest()[:32]}"

    async def forget(self, name: str) -> None:
        self.backends.pop(name, None)
        await self.rebuild()

    async def rebuild(self) -> None:
        """The node union: local nodes plus stand-ins for what only backends have. Lanes
        that change while it is built get one build more after it, not one each (a
        thousand backends start together); returns once a build that began after the
        call is done."""
        self._again = self._rebuilding is not None
        while (building := self._rebuilding) is not None:
            await asyncio.shield(building)  # the build clears `_rebuilding` as it ends
            if not self._again:
                return
        building = self._rebuilding = asyncio.create_task(self._build(), name="fleet-nodes")
        await asyncio.shield(building)

    async def follow_elsewhere(self, node_sets: list[Capabilities]) -> None:
        """What lanes of other gateways run changed: the node union is built anew."""
        self.elsewhere = node_sets
        await self.rebuild()

    async def _build(self) -> None:
        """Built in a thread: it copies backends' node definitions, each distinct set once
        (backends with the same nodes share one)."""
        try:
            self._again = False
            known = [lane.capabilities for lane in self.backends.values()] + self.elsewhere
            distinct = {id(capabilities): capabilities for capabilities in known}
            remote = [capabilities.object_info for capabilities in distinct.values()]
            local = self.engine.registry
            built = await asyncio.to_thread(union_registry, local, remote) if remote else local
            self.registry = built
        finally:
            self._rebuilding = None

    def runs_remotely(self, prompt: dict[str, Any]) -> bool:
        """Whether `prompt` can only run on a backend (the local lane lacks a class)."""
        if self.local is None:
            return True
        registry = self.engine.registry
        return any(str(node.get("class_type")) not in registry for node in prompt.values())

    async def validate_on_backend(
        self, prompt: dict[str, Any], targets: list[str] | None, folders: Folders, tenant: str
    ) -> tuple[bool, dict[str, Any]] | None:
        """The verdict of a backend that could run `prompt` and validates for the gateway
        (see `ComfyUILane.validate`); None when there is none."""
        for lane in self.backends.values():
            if lane.validates and not lane.draining and not lane.capabilities.missing_for(prompt):
                verdict = await lane.validate(prompt, targets, folders, tenant)
                if verdict is not None:
                    return verdict
        return None

    def unrunnable(
        self, prompt: dict[str, Any], *, child: bool = False
    ) -> dict[str, list[str]] | None:
        """None when some lane can run `prompt` (or a worker may join that can); else,
        per lane, what it lacks. A `child` prompt never runs on the local lane."""
        if self.awaits_workers:
            return None
        if any(node_set.can_run(prompt) for node_set in self.elsewhere):
            return None  # a worker of another gateway runs it
        reasons: dict[str, list[str]] = {}
        if self.local is not None and child:
            reasons[self.local.name] = ["child prompts run on backends and workers"]
        elif self.local is not None:
            missing = [
                f"node #{node_id}: class {node.get('class_type')} is not installed"
                for node_id, node in prompt.items()
                if node.get("class_type") not in self.engine.registry
            ]
            if not missing:
                return None
            reasons[self.local.name] = missing
        for lane in self.backends.values():
            missing = lane.capabilities.missing_for(prompt)
            if not missing and not lane.draining:
                return None
            if not lane.connected:
                missing = [f"backend {lane.spec.name} is down", *missing]
            reasons[lane.name] = missing or ["draining"]
        return reasons

    def object_info(
        self, class_type: str | None = None, folders: Folders | None = None
    ) -> dict[str, Any]:
        """`/object_info` over the whole fleet, listing the files of `folders` (a tenant's;
        by default the gateway's own)."""
        with using_folders(folders or self.folders):
            return self.registry.object_info(class_type)

    async def remote_view(self, backend: str, query: Mapping[str, str]) -> FileAnswer | None:
        """`/view` of a file kept on a backend (reference mode); None when the backend is
        unknown, a 502 answer when it could not be asked."""
        lane = self.backends.get(backend)
        if lane is None:
            return None
        params = {k: v for k, v in query.items() if k in VIEW_PARAMS}
        try:
            return await lane.read_file("/view", params)
        except BackendError:
            return FileAnswer(502, b"", "text/plain")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
