"""The two graph editors the browser tests drive: the one installed with comfyfleet and
served by default (comfyui-frontend-package 1.58.1), and the one ComfyUI 0.3.64 pins
(1.27.10), served with `--front-end-root` from what `make editor-1.27` unpacks into
.cache/ (or the `static` folder COMFYFLEET_PINNED_EDITOR names).

Tests of the pinned one are skipped when it is not unpacked; `make test` unpacks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Editor:
    version: str
    #: Its `static` folder for --front-end-root; None for the installed default.
    root: Path | None
    #: What it asks and a new user has not got, answered 404 by ComfyUI too: user.css (two
    #: places), saved workflows, bookmarks, subgraphs and templates (the spelling is the
    #: editor's).
    expected_404: frozenset[str]

    def serve_args(self) -> list[str]:
        return [] if self.root is None else ["--front-end-root", str(self.root)]

    @property
    def unpacked(self) -> bool:
        return self.root is None or (self.root / "index.html").is_file()


_NEW_USER_404 = {
    "/api/userdata/workflows%2F.index.json",
    "/user.css",
    "/api/userdata/user.css",
    "/api/userdata?dir=workflows&recurse=true&split=false&full_info=true",
    "/api/userdata/comfy.templates.json",
}
DEFAULT = Editor(
    "1.58.1",
    None,
    frozenset(
        _NEW_USER_404 | {"/api/userdata?dir=subgraphs&recurse=true&split=false&full_info=true"}
    ),
)
PINNED = Editor(
    "1.27.10",
    Path(
        os.environ.get("COMFYFLEET_PINNED_EDITOR")
        or REPO / ".cache/comfyui-frontend-1.27.10/comfyui_frontend_package/static"
    ),
    frozenset(
        _NEW_USER_404 | {"/api/userdata?dir=subgraphs%2F&recurse=true&split=false&full_info=true"}
    ),
)
needs_pinned = pytest.mark.skipif(
    not PINNED.unpacked, reason="comfyui-frontend-package 1.27.10 not unpacked: `make editor-1.27`"
)
#: Both editors, for tests that hold for either.
BOTH = [
    pytest.param(DEFAULT, id=DEFAULT.version),
    pytest.param(PINNED, id=PINNED.version, marks=needs_pinned),
]
