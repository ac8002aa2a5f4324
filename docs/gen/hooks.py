"""mkdocs hooks: pages that show a file of the repository kept outside docs/.

A line `<!-- include: BENCHMARKS.md -->` in a page is replaced, at build time, by that
file (a path from the repository's root) without its first `# ` title. Its relative links
are rewritten: to the page's own relative link when they point into docs/, else to the
path as code text (the site holds only docs/). So BENCHMARKS.md, CONFORMANCE.md and
CHAOS.md, which `make bench`, `make conformance` and `make chaos` rewrite, are shown as
they are now, with nothing to regenerate.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.MULTILINE)
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def included(name: str, page: str) -> str:
    """The file `name` (from the repository's root) as the page `page` (from docs/) shows it."""
    path = (ROOT / name).resolve()
    if not path.is_relative_to(ROOT) or not path.is_file():
        raise ValueError(f"{page}: cannot include {name}: no such file in the repository")
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        if line.startswith("# "):
            del lines[number]
            break
    base = posixpath.dirname(name)
    page_dir = posixpath.dirname(page)

    def link(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        where, _, anchor = target.partition("#")
        full = posixpath.normpath(posixpath.join(base, where))
        if full.startswith("docs/") and (ROOT / full).exists():
            relative = posixpath.relpath(full[len("docs/") :], page_dir or ".")
            return f"[{text}]({relative}{'#' + anchor if anchor else ''})"
        return f"`{full}`" if text.strip("`") == full else f"{text} (`{full}`)"

    return "\n".join(LINK.sub(link, line) for line in lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    source = page.file.src_uri
    return INCLUDE.sub(lambda m: included(m.group(1), source), markdown)
