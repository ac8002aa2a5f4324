"""Workers' nodes across gateways: a worker connects to one gateway of a shared store,
and only that gateway reaches it, but any of them may take the prompt it is to run.

Each gateway publishes in the store the node set of each of its workers' lanes (the
lane's object_info and model files, once per distinct set), and follows what the others
publish: their node sets join its own node union (so it validates those prompts and
lists those nodes in /object_info), and a prompt only such a lane can run is accepted
and queued (a worker's gateway claims it from the one queue). A lane counts while its
gateway's lease holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from comfyfleet.lanes.capabilities import Capabilities
from comfyfleet.lanes.comfyui import ComfyUILane
from comfyfleet.lanes.fleet import Fleet
from comfyfleet.store.base import JobStore, StoreError
from comfyfleet.store.seams.published_nodes import MAX_NODE_SET_BYTES

log = logging.getLogger(__name__)

#: Seconds between looks at what the other gateways published (and at this one's lanes).
FOLLOW_EVERY = 2.0


class SharedNodes:
    def __init__(
        self, store: JobStore, fleet: Fleet, lanes: Callable[[], Mapping[str, ComfyUILane]]
    ) -> None:
        self.store = store
        self.fleet = fleet
        self._lanes = lanes  # this gateway's workers' lanes, by name
        self._published: dict[str, str] = {}  # lane -> digest, as the store has it
        # The last node set made of each distinct Capabilities (lanes share them).
        self._encoded: dict[int, tuple[Capabilities, str, bytes]] = {}
        self._followed: dict[str, Capabilities] = {}  # digest -> what it allows
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.store.shared and self._task is None:
            self._task = asyncio.create_task(self._run(), name="shared-nodes")

    def poke(self) -> None:
        """A lane's nodes changed, or a lane came or went: look now."""
        self._poked.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        with contextlib.suppress(StoreError):
            for lane in list(self._published):
                await self.store.unpublish_nodes(lane)

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except StoreError as exc:  # the store is away: look again at the next tick
                log.warning("could not share workers' nodes: %s", exc)
            except Exception:  # never the end of sharing: the next tick tries again
                log.exception("sharing workers' nodes failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), FOLLOW_EVERY)
            self._poked.clear()

    async def tick(self) -> None:
        await self._publish()
        await self._follow()

    async def _publish(self) -> None:
        lanes = {
            name: lane for name, lane in self._lanes().items() if lane.capabilities.object_info
        }
        for name in [n for n in self._published if n not in lanes]:
            await self.store.unpublish_nodes(name)
            del self._published[name]
        for name, lane in lanes.items():
            encoded = await self._encode(lane.capabilities)
            if encoded is None:
                continue
            digest, node_set = encoded
            if self._published.get(name) != digest:
                await self.store.publish_nodes(name, digest, node_set)
                self._published[name] = digest
        live = {id(lane.capabilities) for lane in lanes.values()}
        self._encoded = {k: v for k, v in self._encoded.items() if k in live}

    async def _encode(self, capabilities: Capabilities) -> tuple[str, bytes] | None:
        known = self._encoded.get(id(capabilities))
        if known is not None and known[0] is capabilities:
            return known[1], known[2]
        node_set = await asyncio.to_thread(_node_set_bytes, capabilities)
        if len(node_set) > MAX_NODE_SET_BYTES:
            log.warning("a worker's node set of %d bytes is not shared", len(node_set))
            return None
        digest = hashlib.sha256(node_set).hexdigest()
        self._encoded[id(capabilities)] = (capabilities, digest, node_set)
        return digest, node_set

    async def _follow(self) -> None:
        digests = set((await self.store.nodes_elsewhere()).values())
        followed = {d: c for d, c in self._followed.items() if d in digests}
        for digest in digests - followed.keys():
            node_set = await self.store.node_set(digest)
            if node_set is None or len(node_set) > MAX_NODE_SET_BYTES:
                continue  # gone meanwhile (or not one a gateway would publish)
            try:
                followed[digest] = await asyncio.to_thread(_capabilities_of, node_set)
            except (ValueError, RecursionError) as exc:
                log.warning("a published node set could not be read: %s", exc)
        if followed.keys() != self._followed.keys():
            self._followed = followed
            await self.fleet.follow_elsewhere(list(followed.values()))


def _node_set_bytes(capabilities: Capabilities) -> bytes:
    node_set = {"object_info": capabilities.object_info, "models": capabilities.models}
    return json.dumps(node_set, sort_keys=True, separators=(",", ":")).encode()


def _capabilities_of(node_set: bytes) -> Capabilities:
    parsed: Any = json.loads(node_set)
    object_info = parsed.get("object_info") if isinstance(parsed, dict) else None
    models = parsed.get("models") if isinstance(parsed, dict) else None
    if not isinstance(object_info, dict) or not _is_model_lists(models):
        raise ValueError("not a node set: object_info and models expected")
    return Capabilities.from_object_info(object_info, models)


def _is_model_lists(models: Any) -> bool:
    return isinstance(models, dict) and all(
        isinstance(files, list) and all(isinstance(f, str) for f in files)
        for files in models.values()
    )
