"""What managed instances keep in their folders: saved capabilities and capped logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from comfyfleet.lanes.capabilities import Capabilities
from comfyfleet.managed.known import load_known, save_known
from comfyfleet.managed.pack import has_pack, pack_paths
from comfyfleet.managed.process import cap_log, exit_reason

INFO = {"OnlyThere": {"input": {"required": {"ckpt": [["a.safetensors", "b.safetensors"]]}}}}


def test_capabilities_are_saved_and_recalled(tmp_path: Path) -> None:
    save_known(tmp_path, Capabilities.from_object_info(INFO, {"checkpoints": ["a.safetensors"]}))
    known = load_known(tmp_path)
    assert known is not None and known.object_info == INFO
    prompt = {"1": {"class_type": "OnlyThere", "inputs": {"ckpt": "b.safetensors"}}}
    assert known.can_run(prompt) and not known.can_run({"1": {"class_type": "Other"}})


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        b'{"object_info": []}',
        b'{"object_info": {}, "models": {"checkpoints": [1]}}',
        b'{"object_info": {"X": {"input": "nope"}}, "models": {}}',
        b'{"object_info": {"X": {"input": {"required": "nope"}}}, "models": {}}',
        b"\xff\xfe",
    ],
)
def test_a_saved_file_of_any_other_shape_is_left_aside(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "capabilities.json").write_bytes(content)
    assert load_known(tmp_path) is None
    assert load_known(tmp_path / "missing") is None


def test_saved_capabilities_are_never_read_or_written_through_a_link_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"object_info": INFO, "models": {}}))
    folder = tmp_path / "instance"
    folder.mkdir()
    (folder / "capabilities.json").symlink_to(outside)
    assert load_known(folder) is None
    (folder / "capabilities.json.new").symlink_to(tmp_path / "target")
    save_known(folder, Capabilities.from_object_info({}, {}))
    assert not (tmp_path / "target").exists()  # the link was replaced, not followed
    assert json.loads(outside.read_text())["object_info"] == INFO
    assert not (folder / "capabilities.json").is_symlink()


def test_a_log_past_its_cap_starts_over_keeping_the_part_before(tmp_path: Path) -> None:
    log = tmp_path / "process.log"
    with log.open("ab") as out:  # as the process holds it: appending
        out.write(b"x" * 100)
        out.flush()
        cap_log(log, limit=50)
        out.write(b"after")
        out.flush()
    assert (tmp_path / "process.log.1").read_bytes() == b"x" * 100
    assert log.read_bytes() == b"after"  # appends land at the new end
    cap_log(tmp_path / "none.log", limit=1)  # no log yet: nothing to do
    assert not (tmp_path / "none.log").exists()


def test_exit_reasons_read_as_sentences() -> None:
    assert exit_reason(3, 0.42) == "exited with code 3 after 0.4 s"
    assert exit_reason(-9, 12.0) == "killed by SIGKILL after 12.0 s"
    assert exit_reason(-200, 1.0) == "killed by signal 200 after 1.0 s"


def test_the_pack_is_offered_through_an_extra_custom_nodes_folder(tmp_path: Path) -> None:
    root = tmp_path / "da:ta #1"  # any folder name stays one YAML value
    paths = pack_paths(root)
    text = paths.read_text(encoding="utf-8")
    folder = root / "custom_nodes"
    assert text == f"comfyfleet:\n    custom_nodes: {json.dumps(str(folder.resolve()))}\n"
    assert (folder / "comfyfleet_pack" / "__init__.py").is_file()
    assert pack_paths(root) == paths  # replaced on every start
    comfyui = tmp_path / "ComfyUI"
    (comfyui / "custom_nodes").mkdir(parents=True)
    assert not has_pack(comfyui)
    (comfyui / "custom_nodes" / "comfyfleet_pack").mkdir()
    assert has_pack(comfyui)  # installed there: that copy is used
