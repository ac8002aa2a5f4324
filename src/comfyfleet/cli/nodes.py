"""`comfyfleet nodes`: what the engine loaded, and which packs failed."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from comfyfleet.nodes import build_registry


def list_nodes(args: argparse.Namespace) -> int:
    registry = build_registry(testing=args.testing_nodes, custom_nodes=args.custom_nodes)
    failures = [{"pack": f.pack, "path": f.path, "error": f.error} for f in registry.failures]
    if args.json:
        print(json.dumps({"nodes": registry.object_info(), "failed": failures}, indent=2))
        return 0
    rows = [
        (name, node.display_name or name, node.category, node.python_module)
        for name, node in sorted(registry.nodes.items())
    ]
    console = Console()
    if not console.is_terminal:
        # Piped into another program: whole names, one node a line, tab-separated.
        for row in rows:
            print("\t".join(row))
        for failure in failures:
            print(f"pack {failure['pack']} failed: {failure['error']}", file=sys.stderr)
        return 0
    table = Table("node", "display name", "category", "module")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"{len(registry.nodes)} nodes loaded")
    for failure in failures:
        console.print(f"[red]pack {failure['pack']} failed:[/red] {failure['error']}")
    return 0
