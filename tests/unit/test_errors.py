"""One root for every error comfyfleet defines, and ComfyUI's shape for client errors."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import comfyfleet
from comfyfleet.errors import ClientError, ComfyfleetError
from comfyfleet.server.comfyui_api.idempotency import BadKey
from comfyfleet.server.comfyui_api.waits import BadWait
from comfyfleet.server.plumbing.client_json import RefusedJson

#: Modules that load only inside a real ComfyUI (they import its packages).
NEEDS_COMFYUI = ("comfyfleet.in_comfyui.", "comfyfleet.comfyui_pack.")


def own_exceptions() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for module_info in pkgutil.walk_packages(comfyfleet.__path__, "comfyfleet."):
        name = module_info.name
        if name.startswith(NEEDS_COMFYUI) or name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency that is not installed
            continue
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == name:
                found.append(value)
    return found


def test_every_error_comfyfleet_defines_descends_from_the_root() -> None:
    found = own_exceptions()
    assert len(found) > 40  # the walk reached the packages
    strays = [
        f"{c.__module__}.{c.__qualname__}" for c in found if not issubclass(c, ComfyfleetError)
    ]
    assert strays == []


def test_errors_that_stood_for_a_builtin_are_still_caught_as_it() -> None:
    from comfyfleet.engine.dynamic import NodeNotFoundError
    from comfyfleet.engine.graph import DependencyCycleError
    from comfyfleet.folders import UnsafePath

    assert issubclass(UnsafePath, ValueError)
    assert issubclass(NodeNotFoundError, LookupError)
    assert issubclass(DependencyCycleError, RuntimeError)


@pytest.mark.parametrize(
    ("error", "type_"),
    [
        (RefusedJson("Invalid JSON", "line 1"), "invalid_json"),
        (BadWait("wait must be a number", "abc"), "invalid_wait"),
        (BadKey("send one Idempotency-Key header, not 2"), "invalid_idempotency_key"),
    ],
)
def test_a_client_error_is_comfyuis_error_object(error: ClientError, type_: str) -> None:
    assert isinstance(error, ComfyfleetError) and isinstance(error, ValueError)
    assert error.as_error() == {
        "type": type_,
        "message": error.message,
        "details": error.details,
        "extra_info": {},
    }
