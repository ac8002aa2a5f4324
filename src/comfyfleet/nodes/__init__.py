"""Built-in node packs."""

from __future__ import annotations

from types import ModuleType


def builtin_packs(*, testing: bool = False) -> list[ModuleType]:
    """The packs every engine loads, plus the `testing` pack when asked for."""
    from comfyfleet.nodes import core, fanout, providers

    packs: list[ModuleType] = [core, providers, fanout]
    if testing:
        from comfyfleet.nodes import testing as testing_pack

        packs.append(testing_pack)
    return packs
