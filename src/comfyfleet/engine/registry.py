"""The node registry: node classes by name, loaded from packs (ComfyUI-style modules and
custom node folders). Which packs a process loads is decided above the engine
(`comfyfleet.nodes.build_registry`)."""

from __future__ import annotations

import importlib.util
import logging
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from comfyfleet.engine.nodedef import NodeDef

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackFailure:
    """A node pack that could not be imported, or a node it could not register."""

    pack: str
    path: str
    error: str


@dataclass
class NodeRegistry:
    nodes: dict[str, NodeDef] = field(default_factory=dict)
    failures: list[PackFailure] = field(default_factory=list)
    builtin_names: set[str] = field(default_factory=set)
    #: The web folders of loaded packs (`WEB_DIRECTORY`): JS extensions for the editor.
    web_dirs: dict[str, Path] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def get(self, name: str) -> NodeDef | None:
        return self.nodes.get(name)

    def add_pack(
        self,
        mappings: Mapping[str, type],
        display_names: Mapping[str, str | None] | None = None,
        *,
        pack: str,
        python_module: str | Mapping[str, str],
        builtin: bool = False,
    ) -> None:
        """Register a pack's classes; a custom pack never replaces a built-in name."""
        display_names = display_names or {}
        for name, cls in mappings.items():
            if not builtin and name in self.builtin_names:
                self.failures.append(
                    PackFailure(pack, "", f"node {name!r} is built in and cannot be replaced")
                )
                continue
            module = python_module if isinstance(python_module, str) else python_module[name]
            try:
                # A pack may map a name to None: object_info then says null, as ComfyUI can.
                display = display_names.get(name, name)
                node = NodeDef(name, cls, display_name=display, python_module=module)
            except Exception as exc:  # a malformed class must not take the pack down
                self.failures.append(PackFailure(pack, "", f"node {name!r}: {exc}"))
                continue
            self.nodes[name] = node
            if builtin:
                self.builtin_names.add(name)

    def add_module(self, module: ModuleType, *, pack: str, builtin: bool = False) -> None:
        mappings = getattr(module, "NODE_CLASS_MAPPINGS", None)
        if not isinstance(mappings, Mapping):
            raise TypeError("module has no NODE_CLASS_MAPPINGS dict")
        self.add_pack(
            mappings,
            getattr(module, "NODE_DISPLAY_NAME_MAPPINGS", None),
            pack=pack,
            python_module=getattr(module, "PYTHON_MODULES", None) or module.__name__,
            builtin=builtin,
        )

    def load_custom_nodes(self, directory: Path | str) -> None:
        """Import every pack in `directory` (a `.py` file or a package folder)."""
        root = Path(directory)
        if not root.is_dir():
            self.failures.append(PackFailure(root.name, str(root), "not a directory"))
            return
        for entry in sorted(root.iterdir()):
            if entry.name.startswith((".", "__")) or entry.name.endswith(".disabled"):
                continue
            if entry.is_file() and entry.suffix == ".py":
                self._load_pack(entry.stem, entry)
            elif entry.is_dir() and (entry / "__init__.py").is_file():
                self._load_pack(entry.name, entry / "__init__.py")

    def _load_pack(self, name: str, path: Path) -> None:
        module_name = f"custom_nodes.{name}"
        try:
            spec = importlib.util.spec_from_file_location(
                module_name,
                path,
                submodule_search_locations=[str(path.parent)]
                if path.name == "__init__.py"
                else None,
            )
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            self.add_module(module, pack=name)
            self._note_web_dir(name, path, module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            log.warning("node pack %s failed to import: %s", name, detail, extra={"pack": name})
            self.failures.append(PackFailure(name, str(path), detail))

    def _note_web_dir(self, name: str, path: Path, module: ModuleType) -> None:
        """A pack's `WEB_DIRECTORY`, relative to the folder its module is in (ComfyUI's rule:
        a package's own folder, a single file's custom nodes folder)."""
        web = getattr(module, "WEB_DIRECTORY", None)
        if isinstance(web, str) and (path.parent / web).is_dir():
            self.web_dirs[name] = (path.parent / web).resolve()

    def object_info(self, class_type: str | None = None) -> dict[str, Any]:
        """ComfyUI's `/object_info` (all nodes) or `/object_info/{class}` ({} when unknown)."""
        if class_type is None:
            return {name: node.object_info() for name, node in self.nodes.items()}
        node = self.nodes.get(class_type)
        return {class_type: node.object_info()} if node else {}
