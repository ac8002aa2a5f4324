"""The emulator's videos: playable MP4 files of one colour (the one the prompt and seed
pick), whose headers carry the requested size and length."""

from __future__ import annotations

from comfyfleet.fanout.solid_mp4 import solid_mp4

FPS = 24


def render_mp4(width: int, height: int, seconds: int, rgb: tuple[int, int, int]) -> bytes:
    return solid_mp4(width, height, rgb, seconds * FPS, FPS)
