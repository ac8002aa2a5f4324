"""The `store` setting: where it comes from, which store it gives, and its password kept
out of errors and reprs."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyfleet.server.config import ConfigError, load_config
from comfyfleet.store import open_store
from comfyfleet.store.postgres import PostgresStore
from comfyfleet.store.sqlite import SQLiteStore

URL = "postgresql://fleet:pw-7c1d@db.example/jobs"


def test_the_store_comes_from_the_file_the_variable_or_the_flag(tmp_path: Path) -> None:
    assert load_config(env={}).store is None
    config_file = tmp_path / "server.toml"
    config_file.write_text('store = "postgresql://file@h/db"\n', encoding="utf-8")
    assert load_config(config_file, env={}).store == "postgresql://file@h/db"
    env = {"COMFYFLEET_STORE": "postgres://env@h/db"}
    assert load_config(config_file, env=env).store == "postgres://env@h/db"
    flags = {"store": "postgresql://flag@h/db"}
    assert load_config(config_file, env=env, overrides=flags).store == "postgresql://flag@h/db"
    assert load_config(env={"COMFYFLEET_STORE": ""}).store is None


def test_a_url_of_another_kind_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigError, match="unknown store URL scheme 'mysql'") as caught:
        load_config(env={"COMFYFLEET_STORE": "mysql://fleet:pw-7c1d@db.example/jobs"})
    assert "pw-7c1d" not in str(caught.value)


def test_the_config_repr_leaves_the_url_out() -> None:
    config = load_config(env={"COMFYFLEET_STORE": URL})
    assert config.store == URL
    assert "pw-7c1d" not in repr(config)


def test_open_store_picks_the_store(tmp_path: Path) -> None:
    default = tmp_path / "comfyfleet.db"
    postgres = open_store(URL, default=default)
    assert isinstance(postgres, PostgresStore) and "pw-7c1d" not in repr(postgres)
    assert isinstance(open_store("postgres://h/db", default=default), PostgresStore)
    for location in (None, ""):
        sqlite = open_store(location, default=default)
        assert isinstance(sqlite, SQLiteStore) and sqlite.path == default
    elsewhere = open_store(str(tmp_path / "other.db"), default=default)
    assert isinstance(elsewhere, SQLiteStore) and elsewhere.path == tmp_path / "other.db"
    with pytest.raises(ValueError, match="unknown store URL scheme"):
        open_store("sqlite://x", default=default)
