"""LATENT values as ComfyUI's `.latent` files, and whatever bytes claim to be one."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from comfyfleet import latents


def test_a_latent_comes_back_as_it_went() -> None:
    samples = np.random.default_rng(1).standard_normal((3, 4, 5, 6), dtype=np.float32)
    back = latents.decode(latents.encode({"samples": samples, "batch_index": [0, 1, 2]}))
    assert list(back) == ["samples"] and np.array_equal(back["samples"], samples)
    video = np.ones((1, 16, 2, 4, 4), dtype=np.float32)  # with frames: five dimensions
    assert latents.decode(latents.encode({"samples": video}))["samples"].shape == video.shape


def test_a_file_of_the_old_format_is_scaled_as_comfyui_loads_it() -> None:
    old = save({"latent_tensor": np.full((1, 4, 2, 2), 0.18215, dtype=np.float16)})
    samples = latents.decode(old)["samples"]
    assert samples.dtype == np.float32 and np.allclose(samples, 1.0, atol=1e-3)


@pytest.mark.parametrize(
    "tensors",
    [
        {"other": np.zeros((1, 4, 2, 2), np.float32)},
        {"latent_tensor": np.zeros((4, 2, 2), np.float32)},
        {"latent_tensor": np.zeros((1, 4, 2, 2), np.int32)},
    ],
)
def test_a_file_without_a_latent_is_refused(tensors: dict[str, np.ndarray]) -> None:
    with pytest.raises(latents.LatentError, match="latent_tensor"):
        latents.decode(save(tensors))


def test_a_file_over_the_cap_is_refused_before_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    data = latents.encode({"samples": np.zeros((1, 4, 8, 8), np.float32)})
    monkeypatch.setattr(latents, "MAX_LATENT_BYTES", len(data) - 1)
    with pytest.raises(latents.LatentError, match="over"):
        latents.decode(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes_are_a_latent_or_a_latent_error(data: bytes) -> None:
    with contextlib.suppress(latents.LatentError):
        latents.decode(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256), st.integers(0, 300))
def test_any_header_is_a_latent_or_a_latent_error(header: bytes, size: int) -> None:
    data = size.to_bytes(8, "little") + header
    with contextlib.suppress(latents.LatentError):
        latents.decode(data)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["F32", "F16", "BF16", "F64", "I8", "U8", "BOOL", "F8_E4M3", "X"]),
    st.lists(st.integers(-1, 2**40), max_size=6),
    st.lists(st.integers(-1, 2**40), min_size=0, max_size=3),
    st.binary(max_size=64),
)
def test_any_tensor_header_is_a_latent_or_a_latent_error(
    dtype: str, shape: list[int], offsets: list[int], body: bytes
) -> None:
    header = json.dumps(
        {"latent_tensor": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}
    ).encode()
    with contextlib.suppress(latents.LatentError):
        latents.decode(len(header).to_bytes(8, "little") + header + body)
