"""The one-colour MP4 clips that stand in for videos: their headers, and that a real
decoder (PyAV, as in ComfyUI's environment) shows them as asked."""

from __future__ import annotations

import io

import av
import pytest

from comfyfleet.fanout.mp4 import is_mp4, read_info
from comfyfleet.fanout.solid_mp4 import solid_mp4

CASES = [
    (512, 512, (255, 255, 255), 8, 8.0),
    (1280, 720, (200, 30, 90), 96, 24.0),
    (1080, 1920, (10, 240, 30), 5, 24.0),  # not a multiple of 16: cropped
    (2, 2, (0, 0, 0), 1, 1.0),
]


@pytest.mark.parametrize(("width", "height", "rgb", "frames", "fps"), CASES)
def test_the_headers_say_the_size_length_and_frames(
    width: int, height: int, rgb: tuple[int, int, int], frames: int, fps: float
) -> None:
    data = solid_mp4(width, height, rgb, frames, fps)
    assert is_mp4(data)
    info = read_info(data)
    assert (info.width, info.height, info.frames) == (width, height, frames)
    assert info.seconds == pytest.approx(frames / fps, abs=0.001)
    assert len(data) < 16_000  # about a byte a macroblock, whatever the length


@pytest.mark.parametrize(("width", "height", "rgb", "frames", "fps"), CASES)
def test_a_decoder_shows_every_frame_in_the_colour(
    width: int, height: int, rgb: tuple[int, int, int], frames: int, fps: float
) -> None:
    with av.open(io.BytesIO(solid_mp4(width, height, rgb, frames, fps)), "r") as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.width, stream.height) == ("h264", width, height)
        pictures = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(pictures) == frames
    for picture in pictures:
        assert picture.shape == (height, width, 3)
        # Studio-range YCbCr and back: within a few levels of the colour asked for.
        assert abs(picture.astype(int) - rgb).max() <= 4


@pytest.mark.parametrize(
    ("width", "height", "frames", "fps"),
    [(0, 64, 1, 8.0), (63, 64, 1, 8.0), (64, 8192, 1, 8.0), (64, 64, 0, 8.0), (64, 64, 1, 0.0)],
)
def test_what_it_cannot_write_is_refused(width: int, height: int, frames: int, fps: float) -> None:
    with pytest.raises(ValueError):
        solid_mp4(width, height, (0, 0, 0), frames, fps)
