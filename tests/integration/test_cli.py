"""The `comfyfleet` command, run as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image

from comfyfleet import comfyui_pack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "invert.json"


COMMAND = str(Path(sys.executable).parent / "comfyfleet")


def environment(cwd: Path) -> dict[str, str]:
    """The user's data folder (where `run` keeps its journal) under the test's folder."""
    return {**os.environ, "XDG_DATA_HOME": str(cwd / "user-data")}


def comfyfleet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=environment(cwd),
    )


def test_run_example_writes_and_prints_the_image(tmp_path: Path) -> None:
    done = comfyfleet("run", str(EXAMPLE), "--output-dir", "out", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    paths = [Path(line) for line in done.stdout.split()]
    assert len(paths) == 1 and paths[0].is_file()
    assert paths[0].parent == (tmp_path / "out").resolve()
    with Image.open(paths[0]) as image:
        assert image.size == (256, 256)
        # 0x3333AA inverted, as ComfyUI saves it: 1 - 0xAA/255 is just under 0x55/255 in
        # float32, and the 8-bit cast truncates.
        assert image.convert("RGB").getpixel((10, 10)) == (0xCC, 0xCC, 0x54)
        assert json.loads(image.info["prompt"])["2"]["class_type"] == "ImageInvert"


def test_set_overrides_an_input(tmp_path: Path) -> None:
    done = comfyfleet(
        "run",
        str(EXAMPLE),
        "--quiet",
        "--output-dir",
        "out",
        "--set",
        "1.width=32",
        "--set",
        "3.filename_prefix=mine",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == "mine_00001_.png"
    with Image.open(path) as image:
        assert image.size == (32, 256)


def test_invalid_input_prints_comfyui_error_and_fails(tmp_path: Path) -> None:
    done = comfyfleet("run", str(EXAMPLE), "--quiet", "--set", "1.width=0", cwd=tmp_path)
    assert done.returncode == 1
    body = json.loads(done.stdout)
    assert body["error"]["type"] == "prompt_outputs_failed_validation"
    assert body["node_errors"]["1"]["errors"][0]["type"] == "value_smaller_than_min"


def test_runtime_error_exits_non_zero(tmp_path: Path) -> None:
    workflow = tmp_path / "fail.json"
    workflow.write_text(
        json.dumps(
            {
                "1": {
                    "class_type": "EmptyImage",
                    "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
                },
                "2": {"class_type": "Fail", "inputs": {"value": ["1", 0], "message": "nope"}},
                "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
            }
        )
    )
    done = comfyfleet("run", str(workflow), "--quiet", "--testing-nodes", cwd=tmp_path)
    assert done.returncode == 1
    assert "Fail failed" in done.stderr and "nope" in done.stderr


def test_unusable_file_exits_2(tmp_path: Path) -> None:
    (tmp_path / "ui.json").write_text(json.dumps({"nodes": [], "links": []}))
    done = comfyfleet("run", "ui.json", cwd=tmp_path)
    assert done.returncode == 2
    assert "UI workflow" in json.loads(done.stderr)["error"]["message"]
    missing = comfyfleet("validate", "missing.json", cwd=tmp_path)
    assert missing.returncode == 2


def test_validate_reports_outputs(tmp_path: Path) -> None:
    done = comfyfleet("validate", str(EXAMPLE), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"outputs": ["3"], "node_errors": {}}
    assert not (tmp_path / "output").exists()


def test_nodes_lists_builtins_and_failed_packs(tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "bad.py").write_text("import not_a_real_module\n")
    done = comfyfleet("nodes", "--json", "--custom-nodes", str(packs), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["nodes"]["SaveImage"]["output_node"] is True
    assert [f["pack"] for f in body["failed"]] == ["bad"]
    assert "not_a_real_module" in body["failed"][0]["error"]
    table = comfyfleet("nodes", "--testing-nodes", cwd=tmp_path)
    assert "TestSleep" in table.stdout


def test_install_comfyui_pack_copies_a_pack_that_loads_quietly(tmp_path: Path) -> None:
    comfy = tmp_path / "ComfyUI"
    (comfy / "custom_nodes").mkdir(parents=True)
    for target in (comfy, comfy / "custom_nodes"):  # the folder or its custom_nodes
        done = comfyfleet("install-comfyui-pack", str(target), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    pack = comfy / "custom_nodes" / "comfyfleet_pack"
    assert (pack / "__init__.py").is_file()
    assert not list(pack.rglob("__pycache__"))
    # As ComfyUI loads it (a package under custom_nodes), outside ComfyUI it adds nothing.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import custom_nodes.comfyfleet_pack as p; print(p.NODE_CLASS_MAPPINGS, p.VERSION)",
        ],
        cwd=comfy,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["{}", str(comfyui_pack.VERSION)]


def test_install_comfyui_pack_refuses_a_folder_that_is_not_comfyui(tmp_path: Path) -> None:
    done = comfyfleet("install-comfyui-pack", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert "neither a ComfyUI folder" in done.stderr


def test_version(tmp_path: Path) -> None:
    done = comfyfleet("--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["comfyfleet", "0.1.0"]


def test_help_names_every_flag_and_its_default(tmp_path: Path) -> None:
    emulate = comfyfleet("emulate-provider", "--help", cwd=tmp_path).stdout
    assert "address to listen on (default: 127.0.0.1)" in " ".join(emulate.split())
    assert "(default: 8299)" in emulate and "--throttle-rate" in emulate
    run = " ".join(comfyfleet("run", "--help", cwd=tmp_path).stdout.split())
    assert "where saved images go (default: output)" in run
    assert "an API-format prompt" in run and "--no-journal" in run


def test_nodes_piped_prints_whole_names_one_per_line(tmp_path: Path) -> None:
    done = comfyfleet("nodes", "--testing-nodes", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert all(len(row) == 4 for row in rows)
    names = {row[0] for row in rows}
    assert {"Concurrent Submit | BFLFluxImage", "TestSleep", "SaveImage"} <= names


def test_a_validation_error_starts_with_a_one_line_summary(tmp_path: Path) -> None:
    done = comfyfleet("validate", str(EXAMPLE), "--set", "1.width=wide", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0].startswith(
        "comfyfleet: #1 EmptyImage: Failed to convert an input value to a INT value: width"
    )
    assert json.loads(done.stdout)["node_errors"]["1"]["class_type"] == "EmptyImage"


def test_an_unknown_node_gets_a_did_you_mean(tmp_path: Path) -> None:
    prompt = json.loads(EXAMPLE.read_text())
    prompt["2"]["class_type"] = "ImageInvret"
    (tmp_path / "typo.json").write_text(json.dumps(prompt))
    done = comfyfleet("run", "typo.json", cwd=tmp_path)
    assert done.returncode == 1
    assert "#2: there is no node 'ImageInvret'; did you mean 'ImageInvert'?" in done.stderr
    assert json.loads(done.stdout)["error"]["type"] == "invalid_prompt"


def test_progress_outside_a_terminal_leaves_stderr_clean(tmp_path: Path) -> None:
    done = comfyfleet("run", str(EXAMPLE), "--output-dir", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert len(done.stdout.split()) == 1


def test_ctrl_c_interrupts_the_prompt_and_exits_130(tmp_path: Path) -> None:
    workflow = tmp_path / "slow.json"
    workflow.write_text(
        json.dumps(
            {
                "1": {
                    "class_type": "EmptyImage",
                    "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
                },
                "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": 60}},
                "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
            }
        )
    )
    command = [COMMAND, "run", str(workflow), "--testing-nodes", "--output-dir", "out"]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=environment(tmp_path), stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        # The output folder is made when the prompt starts running, after Ctrl-C is wired.
        while not (tmp_path / "out").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
    finally:
        process.kill()
        process.communicate()
