"""Key references, and keys typed into workflows kept out of everything that is stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.domain.jobs import NewJob
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.fanout.secrets import KeyUnavailable, SecretVault, parse_reference
from comfyfleet.nodes import build_registry

KEY = "typed-KEY-0a1b2c3d4e5f"


@pytest.fixture(scope="module")
def nodes() -> NodeRegistry:
    return build_registry()


def settings_prompt(key: str) -> dict[str, object]:
    return {
        "1": {"class_type": "APISettings", "inputs": {"base_url": "http://x", "api_key": key}},
        "2": {"class_type": "PrimitiveString", "inputs": {"value": f"note: {key}"}},
    }


def test_references_are_told_apart() -> None:
    assert parse_reference("") == ("none", "")
    assert parse_reference(" env:BFL_API_KEY ") == ("env", "BFL_API_KEY")
    assert parse_reference("secret:bfl") == ("secret", "bfl")
    assert parse_reference("<redacted-key 0123456789abcdef>") == ("memory", "0123456789abcdef")
    assert parse_reference("env:") == ("typed", "env:")
    assert parse_reference(KEY) == ("typed", KEY)


def test_env_and_secrets_file_resolve(tmp_path: Path) -> None:
    secrets_file = tmp_path / "secrets.toml"
    secrets_file.write_text('bfl = "file-key-123456789"\nnumber = 3\n')
    vault = SecretVault(secrets_file, env={"BFL": "env-key-123456789"})
    assert vault.resolve("env:BFL") == "env-key-123456789"
    assert vault.resolve("secret:bfl") == "file-key-123456789"
    assert vault.resolve("") == ""
    with pytest.raises(KeyUnavailable, match="MISSING is not set"):
        vault.resolve("env:MISSING")
    with pytest.raises(KeyUnavailable, match="no entry 'number'"):
        vault.resolve("secret:number")
    secrets_file.write_text('bfl = "file-key-123456789"\nlater = "added-later-12345"\n')
    assert vault.resolve("secret:later") == "added-later-12345"  # re-read on a miss
    assert vault.redactor().text("x env-key-123456789 file-key-123456789") == "x *** ***"
    with pytest.raises(KeyUnavailable, match="needs a secrets file") as caught:
        SecretVault().resolve("secret:bfl")
    # Says how to name one, for `comfyfleet run` as for the server.
    assert "COMFYFLEET_SECRETS_FILE" in str(caught.value)


def test_an_unreadable_secrets_file_is_named_but_not_quoted(tmp_path: Path) -> None:
    broken = tmp_path / "secrets.toml"
    broken.write_text('bfl = "unterminated-secret-value\n')
    with pytest.raises(KeyUnavailable) as caught:
        SecretVault(broken).resolve("secret:bfl")
    assert "unterminated" not in str(caught.value) and "secrets.toml" in str(caught.value)


def test_a_typed_key_is_swapped_for_a_marker_everywhere(nodes: NodeRegistry) -> None:
    vault = SecretVault(env={})
    workflow = {"nodes": [{"type": "APISettings", "widgets_values": ["http://x", KEY]}]}
    extra: dict[str, Any] = {"extra_pnginfo": {"workflow": workflow}, "client_id": "c"}
    prompt, scrubbed_extra = vault.scrub(settings_prompt(KEY), extra, nodes)
    text = json.dumps([prompt, scrubbed_extra])
    assert KEY not in text
    marker = prompt["1"]["inputs"]["api_key"]
    assert parse_reference(marker)[0] == "memory"
    assert prompt["2"]["inputs"]["value"] == f"note: {marker}"
    assert scrubbed_extra["extra_pnginfo"]["workflow"]["nodes"][0]["widgets_values"][1] == marker
    assert extra["extra_pnginfo"]["workflow"]["nodes"][0]["widgets_values"][1] == KEY  # a copy
    assert vault.resolve(marker) == KEY
    assert vault.redactor().text(f"Bearer-less {KEY}") == "Bearer-less ***"


def test_references_and_empty_keys_are_left_alone(nodes: NodeRegistry) -> None:
    vault = SecretVault(env={})
    for reference in ("env:BFL_API_KEY", "secret:bfl", ""):
        prompt = settings_prompt(reference)
        assert vault.scrub(prompt, {}, nodes)[0] is prompt


def test_after_a_restart_a_typed_key_is_gone_and_says_so(nodes: NodeRegistry) -> None:
    job = NewJob("p1", 1, False, settings_prompt(KEY), {}, ["1"])
    stored = SecretVault(env={}).scrub_job(job, nodes)
    assert KEY not in json.dumps(stored.prompt)
    marker = stored.prompt["1"]["inputs"]["api_key"]
    with pytest.raises(KeyUnavailable, match="restarted since it was queued"):
        SecretVault(env={}).resolve(marker)  # a new process: a new, empty vault


def test_deeply_nested_extra_data_is_scrubbed_without_recursion(nodes: NodeRegistry) -> None:
    deep: object = KEY
    for _ in range(5000):
        deep = [deep]
    prompt, extra = SecretVault(env={}).scrub(settings_prompt(KEY), {"deep": deep}, nodes)
    inner = extra["deep"]
    while isinstance(inner, list):
        inner = inner[0]
    assert inner == prompt["1"]["inputs"]["api_key"]


def linked_prompt(key: str) -> dict[str, object]:
    """The key in a String node, reaching api_key through a pass-through node."""
    return {
        "1": {"class_type": "APISettings", "inputs": {"base_url": "http://x", "api_key": ["3", 0]}},
        "2": {"class_type": "PrimitiveString", "inputs": {"value": key}},
        "3": {"class_type": "Sleep", "inputs": {"value": ["2", 0], "seconds": 0.5}},
        "4": {"class_type": "PrimitiveString", "inputs": {"value": "a prompt, not a key"}},
        "5": {"class_type": "Sleep", "inputs": {"value": ["4", 0], "seconds": 0.5}},
    }


def test_a_key_linked_into_a_secret_input_is_swapped_for_a_marker(nodes: NodeRegistry) -> None:
    vault = SecretVault(env={})
    workflow = {"nodes": [{"type": "PrimitiveString", "widgets_values": [KEY]}]}
    extra = {"extra_pnginfo": {"workflow": workflow}}
    prompt, scrubbed_extra = vault.scrub(linked_prompt(KEY), extra, nodes)
    assert KEY not in json.dumps([prompt, scrubbed_extra])
    marker = prompt["2"]["inputs"]["value"]
    assert vault.resolve(marker) == KEY  # what APISettings receives through the links
    assert scrubbed_extra["extra_pnginfo"]["workflow"]["nodes"][0]["widgets_values"] == [marker]
    # Only strings that flow into the key: the rest of the prompt is as it was.
    assert prompt["1"]["inputs"] == {"base_url": "http://x", "api_key": ["3", 0]}
    assert prompt["3"]["inputs"] == {"value": ["2", 0], "seconds": 0.5}
    assert prompt["4"]["inputs"]["value"] == "a prompt, not a key"


def test_numbers_choices_and_references_upstream_of_a_key_stay(nodes: NodeRegistry) -> None:
    prompt = {
        "1": {"class_type": "APISettings", "inputs": {"base_url": "http://x", "api_key": ["2", 0]}},
        "2": {"class_type": "Sleep", "inputs": {"value": ["3", 0], "seconds": 0.5}},
        "3": {"class_type": "PrimitiveString", "inputs": {"value": "env:BFL_API_KEY"}},
        "4": {
            "class_type": "Concurrent Collect Images (30)",
            "inputs": {"failure_mode": "fail_fast"},
        },
        "5": {"class_type": "APISettings", "inputs": {"base_url": "http://x", "api_key": ["4", 6]}},
    }
    assert SecretVault(env={}).scrub(prompt, {}, nodes)[0] is prompt


def test_links_that_loop_or_lead_nowhere_end_the_search(nodes: NodeRegistry) -> None:
    prompt = linked_prompt(KEY)
    prompt["2"] = {"class_type": "Sleep", "inputs": {"value": ["3", 0], "seconds": 0.5}}  # a loop
    prompt["6"] = {"class_type": "APISettings", "inputs": {"base_url": "x", "api_key": ["9", 0]}}
    prompt["7"] = {"class_type": "APISettings", "inputs": {"base_url": "x", "api_key": ["2", 0]}}
    assert SecretVault(env={}).scrub(prompt, {}, nodes)[0] is prompt
