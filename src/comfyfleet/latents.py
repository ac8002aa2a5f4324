"""LATENT values and ComfyUI's `.latent` files, the form in which a latent crosses
processes (a child prompt's result read by its parent).

A LATENT value is a dict whose "samples" is a float array ([batch, channels, height,
width], or with frames for video models); other keys (a noise mask, batch indices)
stay in the process that made them. The file is safetensors holding "latent_tensor"
and an empty "latent_format_version_0"; a file without the latter is of the old
format, whose samples ComfyUI scales by 1 / 0.18215 when it loads them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save

from comfyfleet.errors import ComfyfleetError

SAMPLES, FILE_TENSOR, VERSION_MARK = "samples", "latent_tensor", "latent_format_version_0"
OLD_FORMAT_SCALE = 1.0 / 0.18215
#: A latent file is read whole: past this it is refused.
MAX_LATENT_BYTES = 256 * 1024 * 1024


class LatentError(ComfyfleetError, ValueError):
    """A value or file is not a latent; the message says why."""


def samples_of(value: Any) -> np.ndarray:
    """The samples of a LATENT value, as float32; LatentError if it is not one."""
    samples = value.get(SAMPLES) if isinstance(value, dict) else None
    if not isinstance(samples, np.ndarray) or samples.ndim not in (4, 5):
        raise LatentError(f"a {type(value).__name__} is not a latent with samples")
    return np.ascontiguousarray(samples, dtype=np.float32)


def encode(value: Any, metadata: dict[str, str] | None = None) -> bytes:
    """A LATENT value as the bytes of a `.latent` file (blocking: copies the samples)."""
    tensors = {FILE_TENSOR: samples_of(value), VERSION_MARK: np.zeros(0, dtype=np.float32)}
    return save(tensors, metadata)


def decode(data: bytes) -> dict[str, Any]:
    """A `.latent` file's bytes as a LATENT value; LatentError unless it holds one."""
    if len(data) > MAX_LATENT_BYTES:
        raise LatentError(f"a latent file is over {MAX_LATENT_BYTES} bytes")
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise LatentError(f"not a latent file: {exc}") from None
    samples = tensors.get(FILE_TENSOR)
    if samples is None or samples.dtype.kind != "f" or samples.ndim not in (4, 5):
        raise LatentError(f"a latent file holds no {FILE_TENSOR} of 4 or 5 dimensions")
    samples = samples.astype(np.float32)
    if VERSION_MARK not in tensors:
        samples *= np.float32(OLD_FORMAT_SCALE)
    return {SAMPLES: samples}
