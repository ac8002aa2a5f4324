"""The fleet as a provider inside one graph: "Run on the Fleet" runs the part of the
graph upstream of its `image`, `latent` or `video` input as N child prompts through the
gateway's own queue (each a real job: routed, retried, cancelled like any), and a
collector gathers their results in order: images or latents into one batch, videos
into a list.

The parent never runs that upstream part itself (its input is lazy and never asked
for), and it holds no lane slot of its children: it waits on the gateway's engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from comfyfleet import imaging, latents
from comfyfleet.children.graph import (
    GRAPH_INPUT,
    IMAGE,
    KINDS,
    LATENT,
    MAX_CHILDREN,
    VIDEO,
    ChildGraph,
    ChildGraphError,
    child_prompts,
    parse_values,
    result_node,
    split_parent,
    tile_prompts,
)
from comfyfleet.children.jobs import CHILD_JOBS, ChildFailed, ChildJobs, ChildRequest
from comfyfleet.children.tiles import (
    MAX_TILES_PER_SIDE,
    Box,
    TilingError,
    boxes,
    cut,
    stitch,
    tile_file,
)
from comfyfleet.engine.context import NodeContext, current_node
from comfyfleet.engine.services import service
from comfyfleet.fanout import service as pools
from comfyfleet.fanout.collect import FAIL_FAST, FAILURE_MODES, collect
from comfyfleet.fanout.task import UNUSABLE, Task
from comfyfleet.fanout.video import placeholder_clip, video_from_bytes
from comfyfleet.nodes.fanout import PLACEHOLDER_RED, PLACEHOLDER_SIZE
from comfyfleet.nodes.providers.common import failure_epoch, fanout


@dataclass(frozen=True)
class FleetBatch:
    """What "Run on the Fleet" outputs (FLEET_BATCH): one task per child, in order, each
    making a result of `kind` (children.graph.KINDS)."""

    tasks: tuple[Task, ...]
    kind: str = IMAGE


class _FleetNode:
    """What both fleet nodes share: where they are listed, no cache replay of a failed
    child, a delegated input never evaluated here, and queuing children as pool tasks."""

    FUNCTION = "run"
    CATEGORY = "fleet"
    CONCURRENT_SUBMIT = False

    @classmethod
    def IS_CHANGED(cls, **_: Any) -> int:
        return failure_epoch()  # a batch with a failed child is never replayed from the cache

    def check_lazy_status(self, **_: Any) -> list[str]:
        return []  # the delegated input is made by the children, never here

    @staticmethod
    def _here() -> NodeContext:
        here = current_node()
        if here is None:
            raise RuntimeError("the fleet nodes run only inside a prompt")
        return here

    @staticmethod
    async def _queue(
        jobs: ChildJobs,
        here: NodeContext,
        node_id: str,
        prompts: list[dict[str, Any]],
        kind: str = IMAGE,
    ) -> list[Task | None]:
        """Each child prompt as a task of the fan-out pool, in order."""
        pool, tasks = fanout(), []
        for index, child in enumerate(prompts):
            request = ChildRequest(here.prompt_id, node_id, index, child)
            tasks.append(await pool.submit_local(pools.IMAGE, _child(jobs, request, kind), here))
        return list(tasks)


class RunOnFleet(_FleetNode):
    DESCRIPTION = (
        "Runs everything upstream of `image` (or `latent`, or `video`: link one) on the "
        "fleet `count` times, as child prompts queued like any other, with the integer "
        "input named `vary` set to its value + i in the i-th child (i from 0); or, with "
        "values (a JSON list), one child per value with `vary` set to it. Wire `batch` "
        "into the collector of its kind (Collect from the Fleet for images, Collect "
        "Latents or Collect Videos from the Fleet). The gateway fills `graph` from what "
        "feeds the linked input when the prompt is queued."
    )
    RETURN_TYPES = ("FLEET_BATCH",)
    RETURN_NAMES = ("batch",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "count": ("INT", {"default": 4, "min": 1, "max": MAX_CHILDREN}),
                "vary": ("STRING", {"default": "seed"}),
            },
            "optional": {
                "image": ("IMAGE", {"lazy": True}),
                "latent": ("LATENT", {"lazy": True}),
                "video": ("VIDEO", {"lazy": True}),
                # A JSON list: one child per value, `vary` set to it (count is not used).
                "values": ("STRING", {"default": ""}),
                GRAPH_INPUT: ("STRING", {"default": "", "forceInput": True}),
            },
            # PROMPT: inside a real ComfyUI, where no gateway filled `graph` (see _graph).
            "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, values: str = "") -> bool | str:
        try:
            parse_values(values)
        except ChildGraphError as exc:
            return str(exc)
        return True

    async def run(
        self,
        count: int,
        vary: str,
        unique_id: str,
        prompt: Any = None,
        graph: str = "",
        image: Any = None,
        latent: Any = None,
        video: Any = None,
        values: str = "",
    ) -> tuple[FleetBatch]:
        here, node_id = self._here(), str(unique_id)
        parsed = _graph(graph, prompt, node_id, "its image, latent or video input")
        children = child_prompts(parsed, node_id, count, vary, parse_values(values))
        jobs = service(CHILD_JOBS)
        tasks = await self._queue(jobs, here, node_id, children, parsed.kind)
        return (FleetBatch(tuple(t for t in tasks if t is not None), parsed.kind),)


def _graph(graph: str, prompt: Any, node_id: str, delegated: str) -> ChildGraph:
    """The children's graph: as the gateway filled it in, else (inside a real ComfyUI,
    which queued the whole prompt) cut from the prompt itself."""
    if graph:
        return ChildGraph.from_json(graph)
    found = split_parent(prompt)[1].get(node_id) if isinstance(prompt, dict) else None
    if found is None:
        raise ChildGraphError(f"node #{node_id}: link {delegated} to what the children make")
    return found


def _child(
    jobs: ChildJobs, request: ChildRequest, kind: str = IMAGE
) -> Callable[[], Awaitable[Any]]:
    """A child as a task of the fan-out pool: queued, waited for, its result read; its
    job cancelled when the task is (the parent interrupted, or a fail_fast collector)."""

    async def call() -> Any:
        prompt_id = await jobs.queue(request)
        try:
            entry = await jobs.outcome(prompt_id)
        except asyncio.CancelledError:
            await asyncio.shield(jobs.cancel([prompt_id]))
            raise
        kept = (entry.get("outputs") or {}).get(result_node(request.node_id)) or {}
        refs = kept.get(KINDS[kind].listed_as) if isinstance(kept, dict) else None
        if not isinstance(refs, list) or not refs or (kind == VIDEO and len(refs) != 1):
            raise ChildFailed(f"child {request.index + 1} ({prompt_id}) made no {kind}")
        files = [await jobs.file(prompt_id, ref) for ref in refs]
        try:
            return await asyncio.to_thread(_READERS[kind], files)
        except (ValueError, OSError) as exc:  # not an image, latent or video after all
            raise ChildFailed(f"child {request.index + 1} ({prompt_id}): {exc}") from None

    return call


def _images(files: list[bytes]) -> Any:
    arrays = [imaging.decode(data)[0] for data in files]
    return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]


def _latents(files: list[bytes]) -> Any:
    samples = [latents.decode(data)[latents.SAMPLES] for data in files]
    return {latents.SAMPLES: np.concatenate(samples) if len(samples) > 1 else samples[0]}


#: How a child's kept files (blocking: decodes) become the value its parent collects.
_READERS: dict[str, Callable[[list[bytes]], Any]] = {
    IMAGE: _images,
    LATENT: _latents,
    VIDEO: lambda files: video_from_bytes(files[0]),
}


class FleetTile:
    DESCRIPTION = (
        "Where each tile enters the sub-graph of a Tiles on the Fleet node: wire it into "
        "what each tile goes through (an upscale, an img2img), whose image goes to tile."
    )
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("tile",)
    FUNCTION = "tile"
    CATEGORY = "fleet"
    CONCURRENT_SUBMIT = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {}}

    def tile(self) -> tuple[Any]:
        raise ChildGraphError("a Fleet Tile runs only in the children of Tiles on the Fleet")


class TilesOnFleet(_FleetNode):
    DESCRIPTION = (
        "Cuts image into columns x rows tiles reaching overlap pixels into their "
        "neighbours, runs the sub-graph from Fleet Tile to tile on each as a child prompt "
        "on the fleet, and stitches the results back, blended across the overlaps. The "
        "gateway fills graph from what feeds tile when the prompt is queued."
    )
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("image",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        side = {"default": 2, "min": 1, "max": MAX_TILES_PER_SIDE}
        return {
            "required": {
                "image": ("IMAGE", {}),
                "columns": ("INT", side),
                "rows": ("INT", dict(side)),
                "overlap": ("INT", {"default": 32, "min": 0, "max": 4096}),
            },
            "optional": {
                "tile": ("IMAGE", {"lazy": True}),
                GRAPH_INPUT: ("STRING", {"default": "", "forceInput": True}),
            },
            # PROMPT: inside a real ComfyUI, where no gateway filled `graph` (see _graph).
            "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT"},
        }

    async def run(
        self,
        image: Any,
        columns: int,
        rows: int,
        overlap: int,
        unique_id: str,
        prompt: Any = None,
        graph: str = "",
        tile: Any = None,
    ) -> tuple[Any]:
        here = self._here()
        if image.shape[0] != 1:
            raise TilingError(f"one image at a time, not a batch of {image.shape[0]}")
        parsed = _graph(graph, prompt, str(unique_id), "tile")
        height, width = image.shape[1:3]
        tiles = boxes(height, width, columns, rows, overlap)
        jobs = service(CHILD_JOBS)
        files = await _put_tiles(jobs, here.prompt_id, str(unique_id), image, tiles)
        try:
            children = tile_prompts(parsed, str(unique_id), list(files))
            tasks = await self._queue(jobs, here, str(unique_id), children)
            done = await collect(fanout(), tasks, FAIL_FAST, here, _no_placeholder)
        finally:  # ended, failed or interrupted: the tiles are no longer loaded
            await asyncio.shield(jobs.drop_inputs(here.prompt_id, files))
        stitched = await asyncio.to_thread(stitch, done.values, tiles, height, width, overlap)
        return (stitched,)


async def _put_tiles(
    jobs: ChildJobs, parent: str, node_id: str, image: Any, tiles: list[Box]
) -> list[str]:
    """Each tile as a PNG in the input folder, named after the parent, node and tile (the
    same names when the parent runs again)."""

    def encoded() -> list[bytes]:
        return [imaging.encode_png(imaging.to_pil(part[0])) for part in cut(image, tiles)]

    names = []
    for index, png in enumerate(await asyncio.to_thread(encoded)):
        names.append(await jobs.put_input(parent, tile_file(parent, node_id, index), png))
    return names


class _FleetCollector:
    """What the three collectors share: waiting for every child of a batch of their kind,
    in order, and the status report; each says how its results are put together."""

    KIND = IMAGE
    RETURN_NAMES: tuple[str, ...]
    OUTPUT_NODE = True
    FUNCTION = "collect"
    CATEGORY = "fleet"
    CONCURRENT_SUBMIT = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "batch": ("FLEET_BATCH", {}),
                "failure_mode": (FAILURE_MODES, {"default": FAIL_FAST}),
            }
        }

    async def collect(self, batch: FleetBatch, failure_mode: str = FAIL_FAST) -> Any:
        if not isinstance(batch, FleetBatch):
            raise TypeError(f"batch is a {type(batch).__name__}, not a fleet batch")
        if batch.kind != self.KIND:
            raise TypeError(
                f"the batch is of {batch.kind}s: wire it into {COLLECTOR_OF[batch.kind]}"
            )
        tasks: list[Task | None] = list(batch.tasks)
        collected = await collect(fanout(), tasks, failure_mode, current_node(), _no_placeholder)
        failed = [t is not None and t.state in UNUSABLE for t in tasks]
        # In a worker thread: 64 large images make a batch of gigabytes.
        results = await asyncio.to_thread(self.together, collected.values, failed)
        return {"ui": {"text": [collected.status]}, "result": (results, collected.status)}

    @staticmethod
    def together(values: list[Any], failed: list[bool]) -> Any:
        raise NotImplementedError


class CollectFromFleet(_FleetCollector):
    DESCRIPTION = (
        "Waits for every child of a Run on the Fleet node and outputs their images as one "
        "batch, in order; status reports every child as JSON."
    )
    RETURN_TYPES = ("IMAGE", "STRING")
    RETURN_NAMES = ("images", "status")

    @staticmethod
    def together(values: list[Any], failed: list[bool]) -> Any:
        """The children's images as one batch; a failed child's slot (placeholder mode)
        is red, of the size the others have."""
        return _stacked(values, failed, PLACEHOLDER_IMAGE, _red_like)


class CollectLatentsFromFleet(_FleetCollector):
    KIND = LATENT
    DESCRIPTION = (
        "Waits for every child of a Run on the Fleet node whose latent input is linked and "
        "outputs their latents as one batch, in order (a failed child's, in placeholder "
        "mode, is zeros); status reports every child as JSON."
    )
    RETURN_TYPES = ("LATENT", "STRING")
    RETURN_NAMES = ("latent", "status")

    @staticmethod
    def together(values: list[Any], failed: list[bool]) -> Any:
        pairs = zip(values, failed, strict=True)
        samples = [None if bad else latents.samples_of(value) for value, bad in pairs]
        stacked = _stacked(samples, failed, PLACEHOLDER_LATENT, _zeros_like)
        return {latents.SAMPLES: stacked}


class CollectVideosFromFleet(_FleetCollector):
    KIND = VIDEO
    DESCRIPTION = (
        "Waits for every child of a Run on the Fleet node whose video input is linked and "
        "outputs their videos as a list, in order (what takes it runs once per video; a "
        "failed child's, in placeholder mode, is a short black clip); status reports "
        "every child as JSON."
    )
    RETURN_TYPES = ("VIDEO", "STRING")
    RETURN_NAMES = ("videos", "status")
    OUTPUT_IS_LIST = (True, False)

    @staticmethod
    def together(values: list[Any], failed: list[bool]) -> Any:
        return [placeholder_clip() if bad else v for v, bad in zip(values, failed, strict=True)]


#: The collector for each kind of batch (named in the error of a wrong one).
COLLECTOR_OF = {
    IMAGE: "Collect from the Fleet",
    LATENT: "Collect Latents from the Fleet",
    VIDEO: "Collect Videos from the Fleet",
}
#: The shapes standing for a failed child's result when no child made one.
PLACEHOLDER_IMAGE = (1, PLACEHOLDER_SIZE, PLACEHOLDER_SIZE, 3)
PLACEHOLDER_LATENT = (1, 4, 8, 8)


def _no_placeholder() -> None:
    return None  # drawn once the size of the children's results is known (_stacked)


def _red_like(shape: tuple[int, ...]) -> Any:
    return imaging.blank(1, shape[1], shape[2], PLACEHOLDER_RED)


def _zeros_like(shape: tuple[int, ...]) -> Any:
    return np.zeros((1, *shape[1:]), dtype=np.float32)


def _stacked(
    values: list[Any],
    failed: list[bool],
    empty: tuple[int, ...],
    stand_in: Callable[[tuple[int, ...]], Any],
) -> Any:
    """The children's arrays as one batch along their first axis; a failed child's slot
    gets `stand_in` of the shape the others have (`empty` when none made one).
    ValueError when the children's shapes differ."""
    made = [v for v, bad in zip(values, failed, strict=True) if not bad]
    shape = tuple(made[0].shape) if made else empty
    parts = []
    for value, bad in zip(values, failed, strict=True):
        if bad:
            value = stand_in(shape)
        elif value.shape[1:] != shape[1:]:
            raise ValueError(
                f"the children made results of different shapes: {list(value.shape[1:])} "
                f"and {list(shape[1:])}"
            )
        parts.append(value)
    return np.concatenate(parts)


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "Run on the Fleet": RunOnFleet,
    "Collect from the Fleet": CollectFromFleet,
    "Collect Latents from the Fleet": CollectLatentsFromFleet,
    "Collect Videos from the Fleet": CollectVideosFromFleet,
    "Fleet Tile": FleetTile,
    "Tiles on the Fleet": TilesOnFleet,
}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {name: name for name in NODE_CLASS_MAPPINGS}
