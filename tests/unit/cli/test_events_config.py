"""The `events_retention` setting: a duration from the file, the variable or the flag;
0 turns the event log off; anything else is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyfleet.server.config import ConfigError, load_config
from comfyfleet.server.gateway import Gateway


def test_the_retention_comes_from_the_file_the_variable_or_the_flag(tmp_path: Path) -> None:
    assert load_config(env={}).events_retention == 3600.0
    config_file = tmp_path / "server.toml"
    config_file.write_text('events_retention = "2h"\n', encoding="utf-8")
    assert load_config(config_file, env={}).events_retention == 7200.0
    env = {"COMFYFLEET_EVENTS_RETENTION": "15m"}
    assert load_config(config_file, env=env).events_retention == 900.0
    flags = {"events_retention": "90"}
    assert load_config(config_file, env=env, overrides=flags).events_retention == 90.0
    config_file.write_text("events_retention = 30\n", encoding="utf-8")
    assert load_config(config_file, env={}).events_retention == 30.0


@pytest.mark.parametrize("bad", ["-5", "soon", "1y", "", "nan"])
def test_a_retention_that_is_not_a_duration_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"events_retention|duration"):
        load_config(env={"COMFYFLEET_EVENTS_RETENTION": bad})


@pytest.mark.parametrize("bad", ["-1", "inf", "nan", "true"])
def test_a_retention_from_the_file_must_be_a_duration_too(tmp_path: Path, bad: str) -> None:
    config_file = tmp_path / "server.toml"
    config_file.write_text(f"events_retention = {bad}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"events_retention|duration"):
        load_config(config_file, env={})


def test_zero_turns_the_event_log_off(tmp_path: Path) -> None:
    config = load_config(env={"COMFYFLEET_EVENTS_RETENTION": "0"}, overrides={"data_dir": tmp_path})
    assert config.events_retention == 0.0
    gateway = Gateway.create(config)
    try:
        assert gateway.events is None
    finally:
        gateway.engine.close()
