"""`[[worker_tokens]]`: names and secrets checked at start, never a client token too,
matched in constant time, never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyfleet.server.config import ConfigError, load_config
from comfyfleet.workers.tokens import WorkerToken, holder

GOOD = "worker-secret-0123456789"


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "server.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_tokens_come_from_the_file_inline_or_from_a_token_file(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("from-a-file-abcdef0123\n")
    loaded = load_config(
        config(
            tmp_path,
            f'[[worker_tokens]]\nname = "pool"\ntoken = "{GOOD}"\n'
            '[[worker_tokens]]\nname = "gpu.7"\ntoken_file = "secret.txt"\ntenant = "alice"\n',
        ),
        env={},
    )
    assert loaded.worker_tokens == (
        WorkerToken("pool", GOOD),
        WorkerToken("gpu.7", "from-a-file-abcdef0123", tmp_path / "secret.txt", "alice"),
    )
    assert GOOD not in repr(loaded.worker_tokens)


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        (f'name = "bad name"\ntoken = "{GOOD}"', "name"),
        ('name = "pool"\ntoken = "short"', "at least 16"),
        ('name = "pool"', "token or token_file"),
        (f'name = "pool"\ntoken = "{GOOD}"\nowner = "x"', "only name"),
        (f'name = "pool"\ntoken = "{GOOD}"\ntenant = "../x"', "tenant"),
        (f'token = "{GOOD}"', "name must be a string"),
    ],
)
def test_a_bad_table_is_refused_naming_what(tmp_path: Path, table: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        load_config(config(tmp_path, f"[[worker_tokens]]\n{table}\n"), env={})


def test_a_name_or_token_twice_and_a_token_of_both_kinds_are_refused(tmp_path: Path) -> None:
    twice = f'[[worker_tokens]]\nname = "a"\ntoken = "{GOOD}"\n' * 2
    with pytest.raises(ConfigError, match="used twice"):
        load_config(config(tmp_path, twice), env={})
    both = f'[[worker_tokens]]\nname = "a"\ntoken = "{GOOD}"\n[[auth.tokens]]\ntoken = "{GOOD}"\n'
    with pytest.raises(ConfigError, match="also a client token"):
        load_config(config(tmp_path, both), env={})


def test_the_holder_of_a_presented_token() -> None:
    tokens = [WorkerToken("a", GOOD), WorkerToken("b", GOOD + "x")]
    assert holder(tokens, GOOD + "x") == tokens[1]
    assert holder(tokens, GOOD[:-1]) is None
    assert holder(tokens, "") is None
