"""The providers pack: API settings, and every provider's nodes and driver.

Each provider is one package here (its API client, its fan-out driver and its
nodes); `PROVIDERS` lists them, and the pack's node mappings and the drivers
the process installs are built from that list. Each provider node waits for
its job; its "Concurrent Submit" twin (minted at start-up, see `nodes.fanout`)
sends the same job and returns a task at once. Both go through the fan-out
service's pools and journal.
"""

from __future__ import annotations

from types import ModuleType

from comfyfleet.fanout.drivers import Driver
from comfyfleet.nodes.providers import bfl, openai_images, openai_videos
from comfyfleet.nodes.providers.settings import APISettings

#: One package per provider: `DRIVER`, `NODE_CLASS_MAPPINGS`, `NODE_DISPLAY_NAME_MAPPINGS`.
PROVIDERS: tuple[ModuleType, ...] = (bfl, openai_images, openai_videos)

NODE_CLASS_MAPPINGS: dict[str, type] = {"APISettings": APISettings}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {"APISettings": "API Settings"}
DRIVERS: dict[str, Driver] = {}
for _provider in PROVIDERS:
    NODE_CLASS_MAPPINGS.update(_provider.NODE_CLASS_MAPPINGS)
    NODE_DISPLAY_NAME_MAPPINGS.update(_provider.NODE_DISPLAY_NAME_MAPPINGS)
    DRIVERS[_provider.DRIVER.name] = _provider.DRIVER
