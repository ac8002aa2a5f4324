"""Built-in node packs, and the registry a process builds from them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from comfyfleet.engine.registry import NodeRegistry


def builtin_packs(*, testing: bool = False) -> list[ModuleType]:
    """The packs every engine loads, plus the `testing` pack when asked for."""
    from comfyfleet.nodes import core, fanout, fleet, providers

    packs: list[ModuleType] = [core, providers, fanout, fleet]
    if testing:
        from comfyfleet.nodes import testing as testing_pack

        packs.append(testing_pack)
    return packs


def build_registry(
    *, testing: bool = False, custom_nodes: Iterable[Path | str] = ()
) -> NodeRegistry:
    """The built-in packs (plus `testing` on request), then each custom-nodes folder,
    then the Concurrent Submit twins of every image and video node they define."""
    from comfyfleet.nodes.fanout import add_submit_twins

    registry = NodeRegistry()
    for module in builtin_packs(testing=testing):
        registry.add_module(module, pack=module.__name__.rsplit(".", 1)[-1], builtin=True)
    for directory in custom_nodes:
        registry.load_custom_nodes(directory)
    add_submit_twins(registry)
    return registry
