"""The `execution_error` the jobs API lists: its node fields always strings."""

from __future__ import annotations

from comfyfleet.protocol import events
from comfyfleet.server.jobs_api.jobs import listed_error


def test_a_failure_outside_any_node_names_no_node_in_strings() -> None:
    error = events.execution_error("p1", "lost\n", "comfyfleet.LaneFailure")
    listed = listed_error(error)
    assert listed == {**error, "node_id": "", "node_type": ""}
    assert error["node_id"] is None  # the stored error is left as it is


def test_a_nodes_failure_is_listed_as_it_is() -> None:
    error = events.execution_error("p1", "bad\n", "ValueError", node_id="3", node_type="Fail")
    assert listed_error(error) == error
    assert listed_error(None) is None


def test_a_node_without_a_type_gets_an_empty_one() -> None:
    error = events.execution_error("p1", "refused\n", "invalid_prompt", node_id="7")
    listed = listed_error(error)
    assert listed is not None and (listed["node_id"], listed["node_type"]) == ("7", "")
