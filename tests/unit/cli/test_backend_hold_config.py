"""`backend_hold`: how long a comfyfleet backend runs this gateway's prompts past its
last word; from the file or `--backend-hold`, between 1 s and 1 h."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyfleet.server.config import ConfigError, load_config


def test_the_hold_comes_from_the_file_or_the_flag(tmp_path: Path) -> None:
    assert load_config(env={}).backend_hold == 30.0
    config_file = tmp_path / "server.toml"
    config_file.write_text("backend_hold = 12.5\n", encoding="utf-8")
    assert load_config(config_file, env={}).backend_hold == 12.5
    assert load_config(env={}, overrides={"backend_hold": 4.0}).backend_hold == 4.0


@pytest.mark.parametrize("seconds", [0.0, 0.5, 3601.0, float("nan")])
def test_a_hold_out_of_range_is_refused(seconds: float) -> None:
    with pytest.raises(ConfigError, match="backend_hold"):
        load_config(env={}, overrides={"backend_hold": seconds})
