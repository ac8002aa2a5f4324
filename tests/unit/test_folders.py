"""The one rule for paths in a folder: resolve symlinks, then check containment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from comfyfleet.folders import (
    Folders,
    UnsafePath,
    plain_name,
    plain_subfolder,
    resolve_inside,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """`tmp/root` with `inner/file`, a link to it, and links leading out to `tmp/outside`."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inner").mkdir(parents=True)
    outside.mkdir()
    (root / "inner" / "file").write_text("in")
    (outside / "file").write_text("out")
    os.symlink(root / "inner" / "file", root / "alias")
    os.symlink(outside / "file", root / "out-file")
    os.symlink(outside, root / "out-dir")
    return root


def test_paths_inside_resolve_through_links(root: Path) -> None:
    real = (root / "inner" / "file").resolve()
    assert resolve_inside(root, "inner/file") == real
    assert resolve_inside(root, "alias") == real
    assert resolve_inside(root, "") == root.resolve()
    assert resolve_inside(root, "inner/../inner/new") == root.resolve() / "inner" / "new"


@pytest.mark.parametrize(
    "relative", ["..", "../outside/file", "out-file", "out-dir", "out-dir/file", "/etc/passwd"]
)
def test_paths_leading_out_are_refused(root: Path, relative: str) -> None:
    with pytest.raises(UnsafePath, match="outside the root folder"):
        resolve_inside(root, relative)


def test_nul_is_refused(root: Path) -> None:
    with pytest.raises(UnsafePath, match="NUL"):
        resolve_inside(root, "a\x00b")


def test_without_following_the_last_component_a_link_stays_the_link(root: Path) -> None:
    assert resolve_inside(root, "out-file", follow_last=False) == root.resolve() / "out-file"
    assert resolve_inside(root, "alias", follow_last=False) == root.resolve() / "alias"
    with pytest.raises(UnsafePath):
        resolve_inside(root, "out-dir/file", follow_last=False)
    with pytest.raises(UnsafePath):
        resolve_inside(root, "inner/..", follow_last=False)


def test_folders_resolve_by_type(tmp_path: Path) -> None:
    folders = Folders.under(tmp_path).ensure()
    assert folders.resolve_inside("temp", "a") == folders.temp / "a"
    with pytest.raises(UnsafePath, match="unknown folder type"):
        folders.resolve_inside("models", "a")


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "a\\b", "C:x.png", "c:", "x\x00", "/x", None, 3]
)
def test_names_that_are_not_plain_are_refused(name: object) -> None:
    with pytest.raises(UnsafePath):
        plain_name(name)


def test_plain_names_and_subfolders() -> None:
    assert plain_name("x [1]:.png") == "x [1]:.png"
    assert plain_subfolder("") == ""
    assert plain_subfolder("a/b c/d") == "a/b c/d"
    for bad in ("/a", "a/", "a//b", "a/../b", "a\\b", "C:/x", "a/\x00", None):
        with pytest.raises(UnsafePath):
            plain_subfolder(bad)
