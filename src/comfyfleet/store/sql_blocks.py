"""SQL kept in `.sql` files as named blocks: each starts at a `-- name: <name>` line.

Lines before the first block (a header) are ignored; so are comment lines right after a
name line (the block's description). The SQL of a block runs to the next name line.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, str]:
    """`{name: sql}` of every block in `text`; ValueError on a repeated or empty block."""
    parts = _NAME.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        lines = body.strip().splitlines()
        while lines and lines[0].startswith("--"):  # the block's description
            lines.pop(0)
        sql = "\n".join(lines).strip()
        if name in blocks:
            raise ValueError(f"SQL block {name!r} is defined twice")
        if not sql:
            raise ValueError(f"SQL block {name!r} is empty")
        blocks[name] = sql
    return blocks


@cache
def load_blocks(filename: str) -> dict[str, str]:
    """The named blocks of a `.sql` file shipped in this package."""
    text = resources.files("comfyfleet.store").joinpath(filename).read_text("utf-8")
    return parse_blocks(text)
