"""The documentation: the site builds with no warning, its generated reference pages are
what docs/gen/reference.py writes from the code now, and the README stays short with
every relative link pointing at a file of the repository."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: A Markdown link or image: its target, up to a blank or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs/gen/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_reference_pages_are_up_to_date() -> None:
    pages = _generator().generate()
    assert set(pages) == {
        "reference/configuration.md",
        "reference/cli.md",
        "reference/http-api.md",
    }
    stale = [name for name, text in pages.items() if (ROOT / "docs" / name).read_text() != text]
    assert stale == [], f"run .venv/bin/python docs/gen/reference.py: {stale} differ"


def test_configuration_reference_names_every_setting_and_flag() -> None:
    from comfyfleet.cli import build_parser
    from comfyfleet.server.config import ServerConfig

    page = (ROOT / "docs/reference/configuration.md").read_text()
    assert "## `[tenants.NAME]` tables" in page and "## `[fair_share]`" in page  # `shares`
    assert "## `[prices]`" in page and "`paid_jobs_per_day`" in page
    for name in ServerConfig.__dataclass_fields__:
        if name not in ("extra", "auth_tokens", "shares", "prices"):
            assert f"`{name}`" in page, name
            if name not in ("webhooks", "worker_tokens"):  # tables of the file only
                assert f"`COMFYFLEET_{name.upper()}`" in page, name
    serve = next(
        action.choices["serve"]
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction) and "serve" in action.choices
    )
    for action in serve._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help":
                assert f"`{flag}" in page, flag


def test_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    for page in ("index.html", "reference/configuration.html", "project/benchmarks.html"):
        assert (tmp_path / page).is_file(), page


def test_included_files_are_shown() -> None:
    """BENCHMARKS.md and CHAOS.md come in whole, their links into the repository
    rewritten to paths (the site holds only docs/)."""
    hooks_spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs/gen/hooks.py")
    assert hooks_spec is not None and hooks_spec.loader is not None
    hooks = importlib.util.module_from_spec(hooks_spec)
    hooks_spec.loader.exec_module(hooks)
    chaos = hooks.included("CHAOS.md", "project/chaos.md")
    assert not chaos.startswith("# ")
    assert "](chaos/README.md)" not in chaos
    assert "`chaos/README.md`" in chaos
    benchmarks = hooks.included("BENCHMARKS.md", "project/benchmarks.md")
    whole = (ROOT / "BENCHMARKS.md").read_text().rstrip("\n")
    assert benchmarks.endswith(whole.splitlines()[-1])
    assert len(benchmarks.splitlines()) == len(whole.splitlines()) - 1  # less its title
    with pytest.raises(ValueError):
        hooks.included("NO-SUCH-FILE.md", "project/chaos.md")


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move text into docs/"


def test_readme_links_point_at_files() -> None:
    targets = LINK.findall(README.read_text())
    assert targets, "README.md links to nothing"
    missing = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (ROOT / path).exists():
            missing.append(target)
    assert missing == []
