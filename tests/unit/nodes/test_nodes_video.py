"""SaveVideo: a VIDEO value's file copied into the output folder."""

from __future__ import annotations

import pytest

from comfyfleet.fanout.video import video_from_bytes
from comfyfleet.folders import Folders
from comfyfleet.nodes.core.video import SaveVideo
from comfyfleet.testing.emulators.mp4 import render_mp4


def test_saves_with_comfyui_names_and_counters(folders: Folders) -> None:
    video = video_from_bytes(render_mp4(64, 32, 4, (5, 6, 7)))
    assert (video.format, video.get_dimensions(), video.frames) == ("mp4", (64, 32), 96)
    first = SaveVideo().save_video(video, "video/clip_%width%")
    second = SaveVideo().save_video(video, "video/clip_%width%")
    names = [out["ui"]["images"][0]["filename"] for out in (first, second)]
    assert names == ["clip_64_00001_.mp4", "clip_64_00002_.mp4"]
    assert first["ui"]["animated"] == [True]
    assert (folders.output / "video" / names[0]).read_bytes() == video.path.read_bytes()


def test_refuses_a_prefix_outside_the_output_folder_and_a_format_it_cannot_make(
    folders: Folders,
) -> None:
    video = video_from_bytes(render_mp4(16, 16, 4, (0, 0, 0)))
    with pytest.raises(ValueError, match="outside"):
        SaveVideo().save_video(video, "../../escape")
    with pytest.raises(TypeError):
        SaveVideo().save_video("not a video", "video/x")
    unknown = video_from_bytes(b"\x1aE\xdf\xa3 a webm-ish file")
    with pytest.raises(ValueError, match="cannot be saved as mp4"):
        SaveVideo().save_video(unknown, "video/x", format="mp4")
    assert not any(folders.output.rglob("*"))
