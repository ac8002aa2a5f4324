"""`comfyfleet run`'s pieces: --set addressing, the journal's place, the progress line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.cli.journal import user_data_dir
from comfyfleet.cli.run import NodeTally
from comfyfleet.cli.summary import nodes_to_run
from comfyfleet.cli.workflow_file import WorkflowError, apply_overrides

PROMPT: dict[str, Any] = {
    "1": {
        "class_type": "APISettings",
        "inputs": {"base_url": "http://127.0.0.1:8299"},
        "_meta": {"title": "API Settings"},
    },
    "2": {"class_type": "BFLFluxImage", "inputs": {"seed": 1, "api_config": ["1", 0]}},
    "3": {"class_type": "BFLFluxImage", "inputs": {"seed": 2, "api_config": ["1", 0]}},
    "4": {"class_type": "SaveImage", "inputs": {"images": ["2", 0]}, "_meta": {"title": "v1.2"}},
}


def overridden(*assignments: str) -> dict[str, Any]:
    names = {"BFLFluxImage": "FLUX Image (BFL API)"}
    return apply_overrides(copy.deepcopy(PROMPT), list(assignments), names)


def test_set_addresses_a_node_by_id_title_class_or_display_name() -> None:
    assert overridden("1.timeout=5")["1"]["inputs"]["timeout"] == 5
    by_title = overridden("API Settings.base_url=http://10.0.0.2:8299/v1?a=b")
    assert by_title["1"]["inputs"]["base_url"] == "http://10.0.0.2:8299/v1?a=b"
    by_class = overridden("BFLFluxImage.model=flux-dev")
    assert [by_class[n]["inputs"]["model"] for n in ("2", "3")] == ["flux-dev", "flux-dev"]
    shown = overridden("FLUX Image (BFL API).seed=9")
    assert [shown[n]["inputs"]["seed"] for n in ("2", "3")] == [9, 9]
    assert overridden("v1.2.filename_prefix=x")["4"]["inputs"]["filename_prefix"] == "x"


@pytest.mark.parametrize("assignment", ["Nowhere.seed=1", "seed=1", "1.=2"])
def test_set_that_addresses_nothing_is_refused(assignment: str) -> None:
    with pytest.raises(WorkflowError):
        overridden(assignment)


def test_the_journal_lives_in_the_users_data_folder() -> None:
    home = Path("/home/user")
    assert user_data_dir({}, "linux", home) == home / ".local/share/comfyfleet"
    xdg = {"XDG_DATA_HOME": "/data"}
    assert user_data_dir(xdg, "linux", home) == Path("/data/comfyfleet")
    relative = {"XDG_DATA_HOME": "data"}  # invalid by the XDG rules: ignored
    assert user_data_dir(relative, "linux", home) == home / ".local/share/comfyfleet"
    mac = home / "Library/Application Support/comfyfleet"
    assert user_data_dir({}, "darwin", home) == mac
    windows = {"LOCALAPPDATA": "C:/Users/u/AppData/Local"}
    assert user_data_dir(windows, "win32", home) == Path("C:/Users/u/AppData/Local/comfyfleet")


def node(node_id: str, state: str, value: float = 0.0, total: float = 1.0) -> dict[str, Any]:
    entry = {"node_id": node_id, "real_node_id": node_id, "state": state}
    return {**entry, "value": value, "max": total}


def test_the_progress_line_names_every_running_node_and_counts_against_the_prompt() -> None:
    total = nodes_to_run(PROMPT, ["4"])
    assert total == 3  # the settings, the FLUX node it saves, the save; not node 3
    tally = NodeTally()
    for entry in (node("1", "running"), node("2", "running"), node("1", "finished", 1)):
        tally.change(entry["node_id"], entry)
    tally.change("4", node("4", "running"))
    tally.change("2", node("2", "running", 0.5))
    done, of, label = tally.line(PROMPT, total)
    assert (done, of) == (1, 3)
    assert label == "#2 BFLFluxImage 0.5/1, #4 SaveImage 0/1"
    many = NodeTally()
    for n in range(1, 7):
        many.change(str(n), node(str(n), "running"))
    _, of, label = many.line({}, total)
    assert of == 6 and label.endswith("+3 more running") and label.count("#") == 3
