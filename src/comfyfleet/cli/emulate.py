"""`comfyfleet emulate-provider`: the local stand-in for the paid APIs it speaks."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import TYPE_CHECKING

from aiohttp import web

from comfyfleet.provider_http.retry import parse_duration

if TYPE_CHECKING:  # imported when the command runs: every command builds this parser
    from comfyfleet.testing.emulators.state import EmulatorSettings

log = logging.getLogger("comfyfleet.emulator")

_PER = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _seconds(value: str) -> float:
    seconds = parse_duration(value)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (e.g. 2s, 500ms, 1.5)")
    return seconds


def _rate(value: str) -> float:
    """ "N/s", "N/m", "N/h" or a bare N (per second) to requests per second."""
    count, _, unit = value.partition("/")
    try:
        return float(count) / _PER[unit.strip() or "s"]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a rate: {value!r} (e.g. 5/s, 60/m)") from None


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"not a rate between 0 and 1: {value!r}")
    return number


def add_emulate_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from comfyfleet.cli import HelpFormatter

    emulate = commands.add_parser(
        "emulate-provider",
        help="run a local stand-in for the BFL, OpenAI images and OpenAI videos APIs",
        description="Speaks the BFL (FLUX), OpenAI images and OpenAI videos protocols on one port; "
        "GET /_emulator/stats shows the jobs it accepted.",
        formatter_class=HelpFormatter,
    )
    emulate.add_argument("--host", default="127.0.0.1", help="address to listen on")
    emulate.add_argument("--port", type=int, default=8299, help="port to listen on")
    emulate.add_argument("--latency", type=_seconds, default=2.0, help="job duration, e.g. 2s")
    emulate.add_argument("--jitter", type=_seconds, default=0.5, help="+- spread, e.g. 0.5s")
    emulate.add_argument(
        "--fail-rate", type=_fraction, default=0.0, help="share of job requests answered 500"
    )
    emulate.add_argument(
        "--rate-limit", type=_rate, help="job requests per key before 429, e.g. 5/s"
    )
    emulate.add_argument(
        "--throttle-rate",
        type=_fraction,
        default=0.0,
        help="share of all requests (jobs, polls, downloads) answered 429 at random",
    )
    emulate.add_argument("--max-active", type=int, help="pending BFL jobs per key before 429")
    emulate.add_argument(
        "--hang-rate", type=_fraction, default=0.0, help="share of job requests never answered"
    )
    emulate.add_argument(
        "--moderation-rate",
        type=_fraction,
        default=0.0,
        help="share of jobs refused by the content filter",
    )
    emulate.add_argument(
        "--error-rate",
        type=_fraction,
        default=0.0,
        help="share of BFL and video jobs ending in failure",
    )
    emulate.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="KEY",
        help="accepted key (repeatable; none given: any key)",
    )
    emulate.add_argument("--seed", type=int, help="seed the emulator's dice")
    emulate.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")


def settings_from(args: argparse.Namespace) -> EmulatorSettings:
    from comfyfleet.testing.emulators.state import EmulatorSettings

    return EmulatorSettings(
        latency=args.latency,
        jitter=args.jitter,
        fail_rate=args.fail_rate,
        error_rate=args.error_rate,
        rate_limit=args.rate_limit,
        throttle_rate=args.throttle_rate,
        max_active=args.max_active,
        hang_rate=args.hang_rate,
        moderation_rate=args.moderation_rate,
        keys=list(args.key),
        seed=args.seed,
    )


def emulate_main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return asyncio.run(_serve(args.host, args.port, settings_from(args)))


async def _serve(host: str, port: int, settings: EmulatorSettings) -> int:
    # No access log: request lines are noise at load-test rates.
    from comfyfleet.testing.emulators.app import build_emulator_app

    runner = web.AppRunner(build_emulator_app(settings), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", host, port, exc)
        await runner.cleanup()
        return 1
    log.info(
        "emulating the BFL, OpenAI images and videos APIs on http://%s:%s (%d key(s) accepted%s)",
        host,
        port,
        len(settings.keys),
        "" if settings.keys else ", any key",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    return 0
