from __future__ import annotations

import io

from PIL import Image

from comfyfleet.testing.emulators.png import bfl_size, colour, openai_size, render_png


def test_bfl_size_follows_width_height_or_aspect_ratio() -> None:
    assert bfl_size({"width": 320, "height": 192}) == (320, 192)
    assert bfl_size({}) == (1024, 768)
    assert bfl_size({"width": 10**6, "height": 1}) == (4096, 16)
    width, height = bfl_size({"aspect_ratio": "16:9"})
    assert width % 32 == 0 and height % 32 == 0
    assert abs(width / height - 16 / 9) < 0.05
    assert bfl_size({"aspect_ratio": "1:0"}) == (1024, 768)


def test_openai_size() -> None:
    assert openai_size("1536x1024") == (1536, 1024)
    assert openai_size("auto") == (1024, 1024)
    assert openai_size(None) == (1024, 1024)


def test_png_is_deterministic_and_coloured_by_prompt_and_seed() -> None:
    rgb = colour("a cat", 42)
    assert rgb == colour("a cat", 42)
    assert rgb != colour("a cat", 43)
    assert render_png(40, 30, rgb) == render_png(40, 30, rgb)
    with Image.open(io.BytesIO(render_png(40, 30, rgb))) as image:
        assert image.format == "PNG"
        assert image.size == (40, 30)
        assert image.getpixel((5, 5)) == rgb
