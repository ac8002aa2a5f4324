"""Cutting an image into overlapping tiles and stitching processed tiles back: pure numpy.

Tiles form a `columns` x `rows` grid; each reaches `overlap` pixels past its cell on
every inner side. Stitching weighs each tile by a ramp that is 1 inside its cell's core
and falls linearly towards its edges across the overlap, and divides by the sum of the
weights, so a per-pixel sub-graph (the same value from every tile) comes back exactly.
Processed tiles may be scaled (an upscale model): every tile by the same factor.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from comfyfleet.errors import ComfyfleetError

MAX_TILES_PER_SIDE = 16
#: The input files tiles are kept in while their children run: no other name can be
#: removed through the route that removes them (server/comfyui_api/children.py).
TILE_FILE = re.compile(r"fleet-tile-[0-9a-f]{16}-[0-9]{1,3}\.png")


def tile_file(parent: str, node_id: str, index: int) -> str:
    """The name tile `index` of fleet node `node_id` of prompt `parent` is kept as (the
    same name when the parent runs again)."""
    tag = hashlib.sha256(f"{parent}\0{node_id}".encode()).hexdigest()[:16]
    return f"fleet-tile-{tag}-{index}.png"


class TilingError(ComfyfleetError, ValueError):
    """The image cannot be cut as asked, or the tiles cannot be stitched; says why."""


@dataclass(frozen=True)
class Box:
    """A tile's place in the image: rows top..bottom, columns left..right (exclusive)."""

    top: int
    bottom: int
    left: int
    right: int

    @property
    def height(self) -> int:
        return self.bottom - self.top

    @property
    def width(self) -> int:
        return self.right - self.left


def boxes(height: int, width: int, columns: int, rows: int, overlap: int) -> list[Box]:
    """The tiles of a `height` x `width` image, row by row."""
    for name, count, size in (("columns", columns, width), ("rows", rows, height)):
        if not 1 <= count <= MAX_TILES_PER_SIDE:
            raise TilingError(f"{name} must be 1 to {MAX_TILES_PER_SIDE}, not {count}")
        if count > size:
            raise TilingError(f"{count} {name} do not fit in {size} pixels")
    if overlap < 0:
        raise TilingError(f"overlap must not be negative, not {overlap}")
    ys, xs = _cuts(height, rows), _cuts(width, columns)
    return [
        Box(
            max(0, y0 - overlap),
            min(height, y1 + overlap),
            max(0, x0 - overlap),
            min(width, x1 + overlap),
        )
        for y0, y1 in ys
        for x0, x1 in xs
    ]


def cut(image: NDArray[Any], tiles: list[Box]) -> list[NDArray[Any]]:
    """Each tile of a [B, H, W, C] batch."""
    return [np.ascontiguousarray(image[:, b.top : b.bottom, b.left : b.right]) for b in tiles]


def stitch(
    processed: list[NDArray[Any]], tiles: list[Box], height: int, width: int, overlap: int
) -> NDArray[np.float32]:
    """The processed tiles of a `height` x `width` image put back together, blended
    across the overlaps."""
    scale = _scale(processed, tiles)
    first = processed[0]
    out_h, out_w = round(height * scale), round(width * scale)
    total = np.zeros((first.shape[0], out_h, out_w, first.shape[3]), dtype=np.float64)
    weights = np.zeros((out_h, out_w), dtype=np.float64)
    band = overlap * scale
    for tile, box in zip(processed, tiles, strict=True):
        top, left = round(box.top * scale), round(box.left * scale)
        h, w = tile.shape[1:3]
        weight = np.outer(
            _ramp(h, band if box.top > 0 else 0, band if box.bottom < height else 0),
            _ramp(w, band if box.left > 0 else 0, band if box.right < width else 0),
        )
        total[:, top : top + h, left : left + w] += tile.astype(np.float64) * weight[..., None]
        weights[top : top + h, left : left + w] += weight
    return (total / weights[None, :, :, None]).astype(np.float32)


def _cuts(size: int, count: int) -> list[tuple[int, int]]:
    edges = [round(i * size / count) for i in range(count + 1)]
    return list(itertools.pairwise(edges))


def _ramp(length: int, start: float, end: float) -> NDArray[np.float64]:
    """1 in the middle, rising over `start` pixels from the first and falling over `end`
    pixels to the last; never 0, so every pixel has weight."""
    position = np.arange(length, dtype=np.float64) + 0.5
    ramp = np.ones(length, dtype=np.float64)
    if start > 0:
        ramp = np.minimum(ramp, position / (2 * start))
    if end > 0:
        ramp = np.minimum(ramp, (length - position) / (2 * end))
    return ramp


def _scale(processed: list[NDArray[Any]], tiles: list[Box]) -> float:
    if len(processed) != len(tiles):
        raise TilingError(f"{len(processed)} processed tiles for {len(tiles)} tiles")
    factors: set[float] = set()
    for tile, box in zip(processed, tiles, strict=True):
        if tile.ndim != 4:
            raise TilingError("a processed tile is not an image batch")
        factors.add(float(tile.shape[1] / box.height))
        factors.add(float(tile.shape[2] / box.width))
    if len(factors) != 1:
        raise TilingError("the processed tiles are not all scaled by the same factor")
    if len({(t.shape[0], t.shape[3]) for t in processed}) != 1:
        raise TilingError("the processed tiles differ in batch size or channels")
    return factors.pop()
