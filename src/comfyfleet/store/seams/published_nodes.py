"""The nodes of lanes only one gateway reaches (a worker connected to it), published for
the other gateways sharing the store: they validate and accept prompts for those lanes."""

from __future__ import annotations

from typing import Protocol

#: Most bytes of one published node set (ComfyUI's own object_info is about 1 MB).
MAX_NODE_SET_BYTES = 64 * 1024 * 1024


class PublishedNodes(Protocol):
    """A node set is kept once, under the sha256 of its object_info and model lists, for
    every lane that has it; a lane's entry belongs to the gateway that published it and
    counts while that gateway's lease holds."""

    async def publish_nodes(self, lane: str, digest: str, node_set: bytes) -> None:
        """This gateway's lane `lane` runs the node set `node_set` (JSON: object_info and
        models) whose sha256 is `digest`; replaces what it published for `lane` before."""

    async def unpublish_nodes(self, lane: str) -> None:
        """The lane is gone: its entry goes, and node sets no lane has any more."""

    async def nodes_elsewhere(self) -> dict[str, str]:
        """The lanes other live gateways published, with their node sets' digests."""

    async def node_set(self, digest: str) -> bytes | None:
        """A published node set by its digest; None when no lane has it any more."""
