"""`[[comfyui]]` tables: checked, planned into instances, turned into command lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from comfyfleet.domain.backend_names import FleetError
from comfyfleet.lanes.fleet import parse_spec
from comfyfleet.managed.spec import (
    ManagedGroup,
    parse_group,
    parse_groups,
    parse_size,
    plan,
    visible_gpus,
)
from comfyfleet.server.config import ConfigError, load_config

SERVE = ["{python}", "-m", "comfyfleet", "serve", "--port", "{port}", "--data-dir", "{dir}"]


def comfyui_dir(root: Path, venv: str | None = None) -> Path:
    """A folder that looks like a ComfyUI checkout (main.py), with a venv if asked."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "main.py").write_text("")
    if venv:
        (root / venv / "bin").mkdir(parents=True)
        (root / venv / "bin" / "python").write_text("")
    return root


def test_a_comfyui_folder_gets_comfyuis_own_flags_per_gpu(tmp_path: Path) -> None:
    comfy = comfyui_dir(tmp_path / "ComfyUI", venv="venv")
    (group,) = parse_groups([{"path": "ComfyUI", "gpus": "0,1", "per_gpu": 2}], tmp_path)
    assert group.python == str(comfy / "venv" / "bin" / "python")  # its venv, found
    root = tmp_path / "data" / "managed"
    specs = plan([group], root, gpus_found=[], avoid={8200}, free=lambda port: True)
    assert [s.name for s in specs] == [
        "comfyui-gpu0-0",
        "comfyui-gpu0-1",
        "comfyui-gpu1-0",
        "comfyui-gpu1-1",
    ]
    assert [s.port for s in specs] == [8201, 8202, 8203, 8204]  # 8200 left alone
    first = specs[0]
    pack = tmp_path / "pack.yaml"
    argv = first.argv(pack)
    folder = tmp_path / "data" / "managed" / "comfyui-gpu0-0"
    assert argv == [
        group.python,
        "main.py",
        "--listen",
        "127.0.0.1",
        "--port",
        "8201",
        "--output-directory",
        str(folder / "output"),
        "--temp-directory",
        str(folder / "temp"),
        "--input-directory",
        str(folder / "input"),
        "--extra-model-paths-config",
        str(pack),
    ]
    assert first.cwd == comfy
    env = first.environment({"PATH": "/bin", "COMFYFLEET_AUTH_TOKEN": "secret"})
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["PATH"] == "/bin"
    assert "COMFYFLEET_AUTH_TOKEN" not in env  # the gateway's own settings stay its own
    assert specs[2].environment({})["CUDA_VISIBLE_DEVICES"] == "1"
    backend = parse_spec(first.backend())
    assert (backend.url, backend.name, backend.slots) == (first.url, first.name, 1)
    assert "gpu0" in backend.tags and "managed" in backend.tags


def test_a_venv_python_is_kept_as_the_link_it_is(tmp_path: Path) -> None:
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)  # as `python -m venv` makes it
    group = parse_group({"command": SERVE, "python": "venv/bin/python"}, tmp_path)
    assert group.python == str(venv / "python")  # run through the link: the venv is used
    assert parse_group({"command": SERVE, "python": "python3"}, tmp_path).python == "python3"


def test_cpu_instances_get_cpu_and_no_gpu_and_extra_args_come_last(tmp_path: Path) -> None:
    comfyui_dir(tmp_path / "c")
    table = {"path": "c", "gpus": "cpu", "args": ["--user-directory", "{dir}"], "env": {"A": "1"}}
    (group,) = parse_groups([table], tmp_path)
    assert group.python == sys.executable  # no venv in the folder: this interpreter
    (spec,) = plan([group], tmp_path / "m", gpus_found=["0"], avoid=set())
    argv = spec.argv(None)
    assert "--extra-model-paths-config" not in argv  # no pack file: no flag
    assert argv[-3:] == ["--cpu", "--user-directory", str(spec.folder)]
    env = spec.environment({})
    assert "CUDA_VISIBLE_DEVICES" not in env and env["A"] == "1"


def test_gpus_all_means_every_gpu_found_or_the_cpu(tmp_path: Path) -> None:
    comfyui_dir(tmp_path)
    group = parse_group({"path": "."}, tmp_path)
    assert group.gpus is None
    found = plan([group], tmp_path / "m", gpus_found=["0", "1"], avoid=set())
    assert [s.gpu for s in found] == ["0", "1"]
    assert [s.gpu for s in plan([group], tmp_path / "m", gpus_found=[], avoid=set())] == ["cpu"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_a_command_template_runs_any_server(tmp_path: Path) -> None:
    (group,) = parse_groups([{"name": "cf", "gpus": "cpu", "command": SERVE}], tmp_path)
    (spec,) = plan([group], tmp_path / "m", gpus_found=[], avoid=set())
    assert spec.name == "cf-cpu-0"
    assert spec.argv(None) == [
        sys.executable,
        "-m",
        "comfyfleet",
        "serve",
        "--port",
        str(spec.port),
        "--data-dir",
        str(tmp_path / "m" / "cf-cpu-0"),
    ]
    assert spec.cwd == spec.folder  # no ComfyUI folder: it runs in its own


def test_busy_ports_are_skipped_and_a_full_range_refused(tmp_path: Path) -> None:
    group = ManagedGroup(command=tuple(SERVE), gpus=("cpu",), per_gpu=2, port_range=(9000, 9002))
    busy = {9000}
    specs = plan([group], tmp_path, gpus_found=[], avoid=set(), free=lambda p: p not in busy)
    assert [s.port for s in specs] == [9001, 9002]
    with pytest.raises(FleetError, match="no free port left in 9000-9002"):
        plan([group], tmp_path, gpus_found=[], avoid={9001}, free=lambda p: p not in busy)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"gpus": "cpu"}, "give path"),
        ({"path": "."}, "not a ComfyUI folder"),
        ({"command": SERVE, "typo": 1}, "unknown keys"),
        ({"command": ["{python}", "{nope}"]}, "names \\['nope'\\]"),
        ({"command": ["{python"]}, "expected '}'"),
        ({"command": SERVE, "args": ["{x}"]}, "names \\['x'\\]"),
        ({"command": SERVE, "gpus": "0,x"}, "gpus must be"),
        ({"command": SERVE, "per_gpu": 0}, "per_gpu must be"),
        ({"command": SERVE, "port_range": [9000, 8000]}, "not a range"),
        ({"command": SERVE, "max_rss": "lots"}, "not a size"),
        ({"command": SERVE, "max_prompts": True}, "max_prompts must be"),
        ({"command": SERVE, "env": {"A": 1}}, "env must be"),
        ({"command": SERVE, "name": "a/b"}, "name"),
        ({"command": SERVE, "warmup": "missing.json"}, "cannot read warmup"),
        ({"command": SERVE, "health_timeout": 0}, "health_timeout"),
    ],
)
def test_bad_tables_are_refused_with_the_reason(
    tmp_path: Path, table: dict[str, object], message: str
) -> None:
    with pytest.raises(FleetError, match=message):
        parse_group(table, tmp_path)


def test_two_tables_need_two_names(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="give each a name"):
        parse_groups([{"command": SERVE}, {"command": SERVE}], tmp_path)
    named = parse_groups([{"command": SERVE}, {"command": SERVE, "name": "b"}], tmp_path)
    assert [g.name for g in named] == ["comfyui", "b"]


def test_sizes_and_the_warmup_prompt(tmp_path: Path) -> None:
    assert parse_size("800M") == 800 * 2**20
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size(4096) == 4096
    prompt = {"1": {"class_type": "EmptyImage", "inputs": {}}}
    (tmp_path / "warm.json").write_text(json.dumps({"prompt": prompt}))
    group = parse_group({"command": SERVE, "warmup": "warm.json", "max_rss": "12G"}, tmp_path)
    assert group.warmup == prompt and group.max_rss == 12 * 2**30


def test_config_file_env_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    comfy = comfyui_dir(tmp_path / "ComfyUI")
    config = tmp_path / "conf" / "fleet.toml"
    config.parent.mkdir()
    config.write_text(
        '[[comfyui]]\npath = "../ComfyUI"\ngpus = [0, 1]\nmax_prompts = 50\n'
        'port_range = "9100-9199"\n'
    )
    (group,) = load_config(config, env={}).comfyui
    assert (group.path, group.gpus, group.max_prompts) == (comfy, ("0", "1"), 50)
    assert group.port_range == (9100, 9199)

    monkeypatch.chdir(tmp_path)
    (group,) = load_config(env={"COMFYFLEET_COMFYUI": "ComfyUI"}).comfyui
    assert group.path == comfy and group.gpus is None

    flags = {"comfyui": Path("ComfyUI"), "gpus": "cpu", "per_gpu": 2, "comfyui_python": "py3"}
    (group,) = load_config(config, env={}, overrides=flags).comfyui  # in place of the file's
    assert (group.gpus, group.per_gpu, group.python, group.max_prompts) == (
        ("cpu",),
        2,
        "py3",
        None,
    )
    with pytest.raises(ConfigError, match="go with --comfyui"):
        load_config(env={}, overrides={"gpus": "0"})
    with pytest.raises(ConfigError, match="not a ComfyUI folder"):
        load_config(env={}, overrides={"comfyui": tmp_path / "conf"})
