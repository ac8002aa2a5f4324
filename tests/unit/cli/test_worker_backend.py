"""Which backend `comfyfleet worker` starts from its flags: the ComfyUI folder's venv
is its interpreter unless one is named, and a backend of the built-in engine listens on
loopback only and keeps no event log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from comfyfleet.cli import build_parser
from comfyfleet.cli.worker import _local_backend, _problem

GATEWAY = ("worker", "--gateway", "https://fleet.example.com", "--data-dir")


def comfyui(root: Path, venv: str | None) -> Path:
    root.mkdir()
    (root / "main.py").write_text("")
    if venv:
        (root / venv / "bin").mkdir(parents=True)
        (root / venv / "bin" / "python").write_text("")
    return root


@pytest.mark.parametrize("venv", ["venv", ".venv", None])
async def test_a_comfyui_worker_runs_the_folders_venv_else_this_python(
    tmp_path: Path, venv: str | None
) -> None:
    folder = comfyui(tmp_path / "ComfyUI", venv)
    args = build_parser().parse_args([*GATEWAY, str(tmp_path / "d"), "--comfyui", str(folder)])
    assert _problem(args, "t" * 20) is None
    backend = await _local_backend(args)
    assert backend is not None
    expected = str(folder / venv / "bin" / "python") if venv else sys.executable
    assert backend.argv[0] == expected
    assert "127.0.0.1" in backend.argv  # listens on loopback


async def test_a_named_interpreter_wins_over_the_venv(tmp_path: Path) -> None:
    folder = comfyui(tmp_path / "ComfyUI", "venv")
    args = build_parser().parse_args(
        [*GATEWAY, str(tmp_path / "d"), "--comfyui", str(folder), "--comfyui-python", "python3"]
    )
    backend = await _local_backend(args)
    assert backend is not None and backend.argv[0] == "python3"


async def test_an_engine_worker_serves_on_loopback_without_an_event_log(tmp_path: Path) -> None:
    args = build_parser().parse_args([*GATEWAY, str(tmp_path / "d"), "--local-slots", "2"])
    backend = await _local_backend(args)
    assert backend is not None
    argv = backend.argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--local-slots") + 1] == "2"
    assert argv[argv.index("--events-retention") + 1] == "0"


def test_a_comfyui_folder_without_main_py_is_refused(tmp_path: Path) -> None:
    args = build_parser().parse_args([*GATEWAY, str(tmp_path / "d"), "--comfyui", str(tmp_path)])
    assert "no ComfyUI" in (_problem(args, "t" * 20) or "")
