"""The fleet as a provider inside one graph: "Run on the Fleet" runs what feeds its
image (latent, video) as child prompts over four backends, and a collector gathers
them."""

from __future__ import annotations

import io
import json
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from comfyfleet import latents
from comfyfleet.fanout.solid_mp4 import solid_mp4
from comfyfleet.nodes.testing import CLIP_FPS, CLIP_FRAMES
from comfyfleet.testing import LEDGER_ENV
from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import Fleet, call, poll
from tests.integration.gateway.processes import Frames

COLOR = 0x102030


def fleet_prompt(count: int, seconds: float, mode: str = "fail_fast") -> dict[str, Any]:
    """EmptyImage(color) -> Sleep -> Run on the Fleet (vary color) -> Collect -> Preview."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": COLOR},
        },
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {
            "class_type": "Run on the Fleet",
            "inputs": {"image": ["2", 0], "count": count, "vary": "color"},
        },
        "4": {
            "class_type": "Collect from the Fleet",
            "inputs": {"batch": ["3", 0], "failure_mode": mode},
        },
        "5": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}},
    }


def children_of(fleet: Fleet, parent: str) -> list[dict[str, Any]]:
    """The parent's children as the jobs API lists them (by `parent`), in order."""
    jobs = fleet.gateway.get("/api/jobs?limit=200")["jobs"]
    found = []
    for job in jobs:
        if job["parent"] == parent:
            detail = fleet.job(job["id"])
            named = detail["extra_data"]["comfyfleet_parent"]
            assert (named["prompt_id"], detail["parent"]) == (parent, parent)
            found.append({**detail, "index": named["index"]})
    return sorted(found, key=lambda j: j["index"])


def colors(fleet: Fleet, images: list[dict[str, Any]]) -> list[int]:
    found = []
    for ref in images:
        query = "&".join(f"{k}={ref[k]}" for k in ("filename", "subfolder", "type"))
        raw = fleet.gateway.get_bytes(f"/view?{query}")
        pixel = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))[0, 0]
        found.append(int(pixel[0]) << 16 | int(pixel[1]) << 8 | int(pixel[2]))
    return found


def test_a_batch_of_eight_runs_over_four_backends_in_order(make_fleet: MakeFleet) -> None:
    # The parent takes one engine slot; the other could run Sleep, but children never
    # run where parents wait.
    fleet = make_fleet(shared=4, gateway_args=("--local-slots", "2"))
    started = time.monotonic()
    parent = fleet.submit(fleet_prompt(8, 1.0))
    fleet.wait_job(parent, "completed", "failed")
    elapsed = time.monotonic() - started
    entry = fleet.history()[parent]
    assert entry["status"]["status_str"] == "success", entry["status"]
    images = entry["outputs"]["5"]["images"]
    assert colors(fleet, images) == [COLOR + i for i in range(8)]
    children = children_of(fleet, parent)
    assert [c["index"] for c in children] == list(range(8))
    assert {c["status"] for c in children} == {"completed"}
    assert {c["lane"] for c in children} == {f"backend:s{i}" for i in range(4)}
    assert all(c["attempt"] == 1 for c in children)
    assert elapsed < 4.0, elapsed  # serial: 8 s; the bench measures it closely


@pytest.mark.parametrize("how", ["cancel", "interrupt"])
def test_cancelling_the_parent_cancels_every_child(make_fleet: MakeFleet, how: str) -> None:
    fleet = make_fleet(shared=4, gateway_args=("--local-slots", "1"))
    parent = fleet.submit(fleet_prompt(8, 30.0))
    poll(lambda: len(children_of(fleet, parent)) == 8, what="eight children")
    poll(
        lambda: sum(c["status"] == "in_progress" for c in children_of(fleet, parent)) == 4,
        what="four children running",
    )
    if how == "cancel":
        status, _ = call(fleet.gateway.url, "POST", f"/api/jobs/{parent}/cancel")
    else:
        status, _ = call(fleet.gateway.url, "POST", "/interrupt", {"prompt_id": parent})
    assert status == 200
    cancelled_at = time.monotonic()
    poll(
        lambda: {c["status"] for c in children_of(fleet, parent)} == {"cancelled"},
        what="every child cancelled",
    )
    assert time.monotonic() - cancelled_at < 3.0
    ended = fleet.wait_job(parent, "cancelled", "interrupted")["status"]
    assert ended == ("cancelled" if how == "cancel" else "interrupted")


@pytest.mark.parametrize("mode", ["fail_fast", "placeholder"])
def test_children_that_fail_fail_the_parent_or_leave_placeholders(
    make_fleet: MakeFleet, mode: str
) -> None:
    fleet = make_fleet(shared=2, gateway_args=("--local-slots", "1"))
    prompt = fleet_prompt(3, 0.1, mode)
    prompt["2"] = {
        "class_type": "Fail",
        "inputs": {"message": "the child broke", "value": ["1", 0]},
    }
    parent = fleet.submit(prompt)
    fleet.wait_job(parent, "completed", "failed")
    entry = fleet.history()[parent]
    children = children_of(fleet, parent)
    if mode == "fail_fast":
        assert entry["status"]["status_str"] == "error"
        error = entry["status"]["messages"][-1][1]
        assert error["node_id"] == "4" and "the child broke" in error["exception_message"]
        assert {c["status"] for c in children} <= {"failed", "cancelled"}
    else:
        assert entry["status"]["status_str"] == "success"
        assert len(entry["outputs"]["5"]["images"]) == 3
        assert colors(fleet, entry["outputs"]["5"]["images"]) == [0xFF0000] * 3
        assert [c["status"] for c in children] == ["failed"] * 3


def test_an_error_upstream_is_the_parents_node_error(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1, gateway_args=("--local-slots", "1"))
    prompt = fleet_prompt(2, 1.0)
    prompt["2"]["inputs"]["seconds"] = -5  # below Sleep's minimum
    status, answer = call(fleet.gateway.url, "POST", "/prompt", {"prompt": prompt})
    assert status == 400, answer
    assert answer["error"]["type"] == "prompt_outputs_failed_validation"
    assert answer["node_errors"]["2"]["dependent_outputs"] == ["3"]
    assert answer["node_errors"]["2"]["errors"][0]["type"] == "value_smaller_than_min"


def test_children_only_the_engine_could_run_are_refused_at_submit(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(gateway_args=("--local-slots", "2"))  # no backend
    status, answer = call(fleet.gateway.url, "POST", "/prompt", {"prompt": fleet_prompt(2, 0)})
    assert status == 400, answer
    assert answer["error"]["type"] == "no_lane_can_run"
    assert "child prompts run on backends and workers" in answer["error"]["details"]


def test_a_client_cannot_name_a_parent(make_fleet: MakeFleet) -> None:
    """A prompt naming a parent itself would never run on the engine: the name is dropped."""
    fleet = make_fleet(gateway_args=("--local-slots", "1"))
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 1},
        },
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }
    named = {"prompt_id": "p", "node_id": "3", "index": 0}
    body = {"prompt": prompt, "extra_data": {"comfyfleet_parent": named}}
    status, answer = call(fleet.gateway.url, "POST", "/prompt", body)
    assert status == 200, answer
    job = fleet.wait_job(answer["prompt_id"], "completed")
    assert "comfyfleet_parent" not in job["extra_data"]


def ledger_prompt(count: int, seconds: float) -> dict[str, Any]:
    """Each child appends a line to the ledger after `seconds` (counted outside every
    process), batched with an image of its own colour."""
    return {
        "1": {"class_type": "LedgerAppend", "inputs": {"tag": "child", "seconds": seconds}},
        "2": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": COLOR},
        },
        "3": {"class_type": "ImageBatch", "inputs": {"image1": ["1", 0], "image2": ["2", 0]}},
        "4": {
            "class_type": "Run on the Fleet",
            "inputs": {"image": ["3", 0], "count": count, "vary": "color"},
        },
        "5": {
            "class_type": "Collect from the Fleet",
            "inputs": {"batch": ["4", 0], "failure_mode": "fail_fast"},
        },
        "6": {"class_type": "PreviewImage", "inputs": {"images": ["5", 0]}},
    }


def ledger_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(path))
    return path


def test_a_backend_killed_mid_batch_loses_no_child_and_runs_none_twice(
    make_fleet: MakeFleet, ledger: Path
) -> None:
    fleet = make_fleet(dedicated=[()] * 4, gateway_args=("--local-slots", "1"))
    parent = fleet.submit(ledger_prompt(8, 4.0))  # the kill lands well inside a run
    poll(
        lambda: sum(c["status"] == "in_progress" for c in children_of(fleet, parent)) == 4,
        what="four children running",
    )
    victim = next(c for c in children_of(fleet, parent) if c["status"] == "in_progress")
    fleet.backends[victim["lane"].removeprefix("backend:")].kill()
    fleet.wait_job(parent, "completed", "failed", timeout=60)
    assert fleet.history()[parent]["status"]["status_str"] == "success"
    children = children_of(fleet, parent)
    assert len(children) == 8 and {c["status"] for c in children} == {"completed"}
    assert fleet.job(victim["id"])["attempt"] == 2
    runs = Counter(line["prompt_id"] for line in ledger_lines(ledger))
    assert runs == {c["id"]: 1 for c in children}


def test_a_gateway_killed_mid_batch_finds_its_children_again(
    make_fleet: MakeFleet, ledger: Path
) -> None:
    fleet = make_fleet(dedicated=[()] * 4, gateway_args=("--local-slots", "1"))
    parent = fleet.submit(ledger_prompt(8, 2.0))
    poll(lambda: len(ledger_lines(ledger)) >= 2, what="two children done")
    assert len(children_of(fleet, parent)) == 8
    fleet.restart_gateway()
    fleet.wait_job(parent, "completed", "failed", timeout=60)
    assert fleet.history()[parent]["status"]["status_str"] == "success"
    children = children_of(fleet, parent)
    assert len(children) == 8 and {c["status"] for c in children} == {"completed"}
    runs = Counter(line["prompt_id"] for line in ledger_lines(ledger))
    assert runs == {c["id"]: 1 for c in children}


def upload(fleet: Fleet, name: str, picture: np.ndarray) -> None:
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    boundary = "fleetboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + buffer.getvalue()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        fleet.gateway.url + "/upload/image",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def saved_pixels(fleet: Fleet, prompt_id: str, node: str) -> np.ndarray:
    ref = fleet.history()[prompt_id]["outputs"][node]["images"][0]
    query = "&".join(f"{k}={ref[k]}" for k in ("filename", "subfolder", "type"))
    return np.asarray(Image.open(io.BytesIO(fleet.gateway.get_bytes(f"/view?{query}"))))


def tiles_prompt(
    image: str, per_tile: dict[str, Any], columns: int = 2, rows: int = 2, overlap: int = 8
) -> dict[str, Any]:
    """LoadImage(image) -> Tiles on the Fleet, each tile through `per_tile` (node "3",
    fed by the Fleet Tile "2" on its input `value` or `image`) -> SaveImage "5"."""
    tile_input = "value" if per_tile["class_type"] == "Fail" else "image"
    step = {**per_tile, "inputs": {**per_tile["inputs"], tile_input: ["2", 0]}}
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "2": {"class_type": "Fleet Tile", "inputs": {}},
        "3": step,
        "4": {
            "class_type": "Tiles on the Fleet",
            "inputs": {
                "image": ["1", 0],
                "columns": columns,
                "rows": rows,
                "overlap": overlap,
                "tile": ["3", 0],
            },
        },
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "t"}},
    }


INVERT: dict[str, Any] = {"class_type": "ImageInvert", "inputs": {}}


def latent_prompt(seed: int, count: int, upstream_sleep: float = 0.0) -> dict[str, Any]:
    """SeededLatent (32x16, batch 2) -> Sleep -> Run on the Fleet (latent, `count`,
    varying the seed) -> Collect Latents from the Fleet -> SaveLatent "5"."""
    return {
        "1": {
            "class_type": "SeededLatent",
            "inputs": {"seed": seed, "width": 32, "height": 16, "batch_size": 2},
        },
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": upstream_sleep}},
        "3": {
            "class_type": "Run on the Fleet",
            "inputs": {"latent": ["2", 0], "count": count, "vary": "seed"},
        },
        "4": {
            "class_type": "Collect Latents from the Fleet",
            "inputs": {"batch": ["3", 0], "failure_mode": "fail_fast"},
        },
        "5": {
            "class_type": "SaveLatent",
            "inputs": {"samples": ["4", 0], "filename_prefix": "collected/latents"},
        },
    }


def seeded_latents(seed: int, count: int) -> np.ndarray:
    """What latent_prompt's children make, in order, as one batch."""
    return np.concatenate(
        [
            np.random.default_rng(seed + i).standard_normal((2, 4, 2, 4), dtype=np.float32)
            for i in range(count)
        ]
    )


def test_tiles_inverted_on_the_fleet_equal_the_whole_image_inverted(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(shared=4, gateway_args=("--local-slots", "2"))
    picture = np.random.default_rng(7).integers(0, 256, (61, 90, 3), dtype=np.uint8)
    upload(fleet, "tiles_source.png", picture)
    load = {"class_type": "LoadImage", "inputs": {"image": "tiles_source.png"}}
    whole = fleet.submit(
        {
            "1": load,
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {
                "class_type": "SaveImage",
                "inputs": {"images": ["2", 0], "filename_prefix": "w"},
            },
        }
    )
    tiled = fleet.submit(tiles_prompt("tiles_source.png", INVERT))
    for prompt_id in (whole, tiled):
        assert fleet.wait_job(prompt_id, "completed", "failed")["status"] == "completed"
    expected = saved_pixels(fleet, whole, "3")
    # Inverted (1 - x), then saved truncated to 8 bits, as ComfyUI saves: 255 - v or one less.
    assert np.abs(expected.astype(int) - (255 - picture.astype(int))).max() <= 1
    assert np.array_equal(saved_pixels(fleet, tiled, "5"), expected)
    children = children_of(fleet, tiled)
    assert len(children) == 4 and all(c["lane"].startswith("backend:") for c in children)
    # The tiles were files of the input folder for as long as the children needed them.
    assert not list((fleet.gateway.data_dir / "input").glob("fleet-tile-*"))


def test_tiles_of_a_failed_child_are_removed_too(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=2, gateway_args=("--local-slots", "1"))
    upload(fleet, "tiles_fail.png", np.zeros((20, 20, 3), dtype=np.uint8))
    fail = {"class_type": "Fail", "inputs": {"message": "tile broke"}}
    parent = fleet.submit(tiles_prompt("tiles_fail.png", fail, rows=1, overlap=0))
    assert fleet.wait_job(parent, "completed", "failed")["status"] == "failed"
    assert not list((fleet.gateway.data_dir / "input").glob("fleet-tile-*"))


def test_only_a_tiles_name_can_be_removed_through_the_tiles_route(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1, gateway_args=("--local-slots", "1"))
    tile = "fleet-tile-0123456789abcdef-3.png"
    for name in (tile, "kept.png"):
        upload(fleet, name, np.zeros((4, 4, 3), dtype=np.uint8))
    folder = fleet.gateway.data_dir / "input"
    for name in ("kept.png", "..%2Fkept.png", "fleet-tile-0123456789abcdef-3.png.bak"):
        status, answer = call(fleet.gateway.url, "DELETE", f"/comfyfleet/tiles/{name}")
        assert status == 400 and answer["error"]["type"] == "invalid_tile", (name, answer)
    assert (folder / "kept.png").is_file()
    assert call(fleet.gateway.url, "DELETE", f"/comfyfleet/tiles/{tile}")[0] == 204
    assert not (folder / tile).exists() and (folder / "kept.png").is_file()
    assert call(fleet.gateway.url, "DELETE", f"/comfyfleet/tiles/{tile}")[0] == 204  # gone: fine


def test_tiles_without_a_fleet_tile_are_refused_at_submit(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=1, gateway_args=("--local-slots", "1"))
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {
            "class_type": "Tiles on the Fleet",
            "inputs": {"image": ["1", 0], "columns": 2, "rows": 2, "overlap": 0, "tile": ["2", 0]},
        },
        "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
    }
    status, answer = call(fleet.gateway.url, "POST", "/prompt", {"prompt": prompt})
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_prompt"
    assert "one Fleet Tile must feed what makes its tile" in answer["error"]["message"]


def test_fleet_nodes_over_a_huge_graph_are_refused_as_too_large(make_fleet: MakeFleet) -> None:
    """Three fleet nodes over one 9,000-node chain would keep 27,000 nodes (the limit is
    25,000): a 400, and the server answers at once afterwards."""
    fleet = make_fleet(shared=1, gateway_args=("--local-slots", "1"))
    prompt: dict[str, Any] = {
        "0": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        }
    }
    for n in range(1, 9_000):
        prompt[str(n)] = {"class_type": "ImageInvert", "inputs": {"image": [str(n - 1), 0]}}
    for f in range(3):
        prompt[f"f{f}"] = {
            "class_type": "Run on the Fleet",
            "inputs": {"image": ["8999", 0], "count": 2, "vary": "color"},
        }
        prompt[f"c{f}"] = {
            "class_type": "Collect from the Fleet",
            "inputs": {"batch": [f"f{f}", 0], "failure_mode": "fail_fast"},
        }
    status, answer = call(fleet.gateway.url, "POST", "/prompt", {"prompt": prompt})
    assert status == 400, answer
    assert answer["error"]["type"] == "prompt_too_large"
    started = time.monotonic()
    assert fleet.gateway.get("/prompt")["exec_info"]["queue_remaining"] == 0
    assert time.monotonic() - started < 1.0


def test_values_make_one_child_each_and_bad_values_are_a_node_error(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(shared=2, gateway_args=("--local-slots", "1"))
    prompt = fleet_prompt(1, 0.1)
    prompt["3"]["inputs"]["values"] = json.dumps([0x0000FF, 0x00FF00, 0xFF0000])
    frames = Frames(fleet.gateway)
    parent = fleet.submit(prompt, frames.client_id)
    frames.done(parent)
    frames.close()
    assert fleet.wait_job(parent, "completed", "failed")["status"] == "completed"
    # The parent's client sees the collector's progress, children ended of all, and
    # nothing of the children (queued without a client).
    seen = [
        (e["data"]["value"], e["data"]["max"])
        for e in frames.events
        if e["type"] == "progress" and e["data"]["node"] == "4"
    ]
    assert seen[-1] == (3, 3) and seen == sorted(seen), seen
    assert {e["data"].get("prompt_id") for e in frames.events} <= {parent, None}
    images = fleet.history()[parent]["outputs"]["5"]["images"]
    assert colors(fleet, images) == [0x0000FF, 0x00FF00, 0xFF0000]
    prompt["3"]["inputs"]["values"] = "[1,"
    status, answer = call(fleet.gateway.url, "POST", "/prompt", {"prompt": prompt})
    assert status == 400, answer
    assert "values must be a JSON list" in answer["node_errors"]["3"]["errors"][0]["details"]


def kept_files(fleet: Fleet, refs: list[dict[str, Any]]) -> list[bytes]:
    found = []
    for ref in refs:
        query = "&".join(f"{k}={ref[k]}" for k in ("filename", "subfolder", "type"))
        found.append(fleet.gateway.get_bytes(f"/view?{query}"))
    return found


def test_latents_made_on_the_fleet_come_back_as_one_batch_in_order(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(shared=3, gateway_args=("--local-slots", "1"))
    parent = fleet.submit(latent_prompt(40, 3, upstream_sleep=0.3))
    assert fleet.wait_job(parent, "completed", "failed")["status"] == "completed"
    refs = fleet.history()[parent]["outputs"]["5"]["latents"]
    (data,) = kept_files(fleet, refs)
    assert np.array_equal(latents.decode(data)["samples"], seeded_latents(40, 3))
    children = children_of(fleet, parent)
    assert [c["status"] for c in children] == ["completed"] * 3
    assert all(c["lane"].startswith("backend:") for c in children)


def test_videos_made_on_the_fleet_come_back_as_a_list_in_order(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(shared=3, gateway_args=("--local-slots", "1"))
    prompt = {
        "1": {"class_type": "SeededClip", "inputs": {"seed": COLOR}},
        "3": {
            "class_type": "Run on the Fleet",
            "inputs": {"video": ["1", 0], "count": 3, "vary": "seed"},
        },
        "4": {
            "class_type": "Collect Videos from the Fleet",
            "inputs": {"batch": ["3", 0], "failure_mode": "fail_fast"},
        },
        "5": {
            "class_type": "SaveVideo",
            "inputs": {
                "video": ["4", 0],
                "filename_prefix": "collected/clip",
                "format": "auto",
                "codec": "auto",
            },
        },
    }
    parent = fleet.submit(prompt)
    assert fleet.wait_job(parent, "completed", "failed")["status"] == "completed"
    refs = fleet.history()[parent]["outputs"]["5"]["images"]
    assert len(refs) == 3  # SaveVideo ran once per video of the list
    made = kept_files(fleet, refs)
    for index, data in enumerate(made):
        rgb = ((COLOR + index) >> 16 & 255, (COLOR + index) >> 8 & 255, (COLOR + index) & 255)
        assert data == solid_mp4(64, 64, rgb, CLIP_FRAMES, CLIP_FPS), index


def test_a_batch_wired_to_the_wrong_collector_fails_saying_which_to_use(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(shared=1, gateway_args=("--local-slots", "1"))
    prompt = fleet_prompt(1, 0.1)
    prompt["4"]["class_type"] = "Collect Latents from the Fleet"
    prompt["5"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["4", 0], "filename_prefix": "wrong"},
    }
    parent = fleet.submit(prompt)
    assert fleet.wait_job(parent, "completed", "failed")["status"] == "failed"
    error = fleet.history()[parent]["status"]["messages"][-1][1]
    assert "wire it into Collect from the Fleet" in error["exception_message"], error
    prompt = fleet_prompt(1, 0.1)
    prompt["3"]["inputs"]["latent"] = ["1", 0]
    status, answer = call(fleet.gateway.url, "POST", "/prompt", {"prompt": prompt})
    assert status == 400, answer
    assert "link its image or latent or video, not 2" in json.dumps(answer)
