"""`comfyfleet nodes`: what the engine loaded, and which packs failed."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from comfyfleet.nodes import build_registry


def list_nodes(args: argparse.Namespace) -> int:
    registry = build_registry(testing=args.testing_nodes, custom_nodes=args.custom_nodes)
    failures = [{"pack": f.pack, "path": f.path, "error": f.error} for f in registry.failures]
    if args.json:
        print(json.dumps({"nodes": registry.object_info(), "failed": failures}, indent=2))
        return 0
    console = Console()
    table = Table("node", "display name", "category", "module")
    for name, node in sorted(registry.nodes.items()):
        table.add_row(name, node.display_name or name, node.category, node.python_module)
    console.print(table)
    console.print(f"{len(registry.nodes)} nodes loaded")
    for failure in failures:
        console.print(f"[red]pack {failure['pack']} failed:[/red] {failure['error']}")
    return 0
