"""`comfyfleet emulate-provider`: flags, and the server as a real process."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from comfyfleet.cli.emulate import add_emulate_parser, settings_from
from tests.servers import free_port

# The subcommand is wired into `comfyfleet` elsewhere; this drives it the same way.
LAUNCH = """
import argparse, sys
from comfyfleet.cli.emulate import add_emulate_parser, emulate_main
parser = argparse.ArgumentParser(prog="comfyfleet")
add_emulate_parser(parser.add_subparsers(dest="command", required=True))
sys.exit(emulate_main(parser.parse_args(sys.argv[1:])))
"""


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="comfyfleet")
    add_emulate_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["emulate-provider", *argv])


def test_flags_become_settings() -> None:
    args = parse(
        "--latency", "500ms", "--jitter", "0.1s", "--rate-limit", "60/m",
        "--fail-rate", "0.25", "--hang-rate", "0.1", "--moderation-rate", "0.5",
        "--throttle-rate", "0.3", "--key", "a", "--key", "b",
    )  # fmt: skip
    settings = settings_from(args)
    assert settings.latency == 0.5 and settings.jitter == 0.1
    assert settings.rate_limit == 1.0
    assert (settings.fail_rate, settings.hang_rate, settings.moderation_rate) == (0.25, 0.1, 0.5)
    assert settings.keys == ["a", "b"] and settings.throttle_rate == 0.3
    assert (args.host, args.port) == ("127.0.0.1", 8299)


@pytest.mark.parametrize(
    "flags", [("--latency", "soon"), ("--rate-limit", "5/fortnight"), ("--fail-rate", "2")]
)
def test_bad_flags_are_refused(flags: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*flags)
    assert "not a" in capsys.readouterr().err


def test_serves_until_sigterm() -> None:
    port = free_port()
    argv = ["emulate-provider", "--port", str(port), "--latency", "0", "--key", "k"]
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *argv], stderr=subprocess.PIPE)
    try:
        stats = None
        deadline = time.monotonic() + 20
        while stats is None and time.monotonic() < deadline:
            try:
                url = f"http://127.0.0.1:{port}/_emulator/stats"
                with urllib.request.urlopen(url, timeout=5) as response:
                    stats = json.loads(response.read())
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, "emulator exited early"
                time.sleep(0.05)
        assert stats is not None and stats["jobs"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    assert b"emulating the BFL, OpenAI images and videos APIs" in err
