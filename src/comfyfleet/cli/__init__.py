"""The `comfyfleet` command: serve, run, validate, list nodes, install the ComfyUI pack."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from comfyfleet import __version__
from comfyfleet.cli.workflow_file import WorkflowError, load_prompt

#: The exit code of a run stopped by Ctrl-C, as shells report a SIGINT (128 + 2).
INTERRUPTED = 130


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each flag's default, when it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def _engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--custom-nodes",
        action="append",
        default=[],
        metavar="DIR",
        help="load ComfyUI-style node packs from DIR (repeatable)",
    )
    parser.add_argument(
        "--testing-nodes", action="store_true", help="also load the testing pack (Sleep, Fail, ...)"
    )


def _workflow_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workflow", type=Path, help="an API-format prompt (ComfyUI's 'Export (API)'), JSON"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NODE.INPUT=VALUE",
        help="override an input (repeatable); NODE is a node id, title or class "
        '("API Settings.base_url=http://..."), VALUE is JSON or a plain string',
    )
    parser.add_argument(
        "--input-dir", type=Path, default=Path("input"), help="where LoadImage finds files"
    )


def _run_parser(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="execute a workflow (API format) locally",
        description="Validates and runs a workflow on the built-in engine; output files "
        "and texts are printed on stdout, progress on stderr.",
        formatter_class=HelpFormatter,
    )
    _workflow_args(run)
    run.add_argument(
        "--output-dir", type=Path, default=Path("output"), help="where saved images go"
    )
    run.add_argument("--quiet", action="store_true", help="no progress display")
    journal = run.add_mutually_exclusive_group()
    journal.add_argument(
        "--journal",
        type=Path,
        metavar="FILE",
        help="the paid-job journal (SQLite): a job done, or left running, by an earlier "
        "run is reused, never paid twice (default: run-journal.db in the user's data "
        "folder, e.g. ~/.local/share/comfyfleet)",
    )
    journal.add_argument(
        "--no-journal",
        action="store_true",
        help="keep the journal in memory: every run pays for its jobs again",
    )
    _engine_args(run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="comfyfleet", description=__doc__)
    parser.add_argument("--version", action="version", version=f"comfyfleet {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    _run_parser(commands)
    validate = commands.add_parser(
        "validate", help="validate a workflow without running it", formatter_class=HelpFormatter
    )
    _workflow_args(validate)
    validate.add_argument(
        "--cost",
        action="store_true",
        help="say instead which paid jobs it would send (provider, model, count) and what "
        "they cost by the price table: the summary on stderr, JSON on stdout (no journal "
        "is looked in: a job a run would reuse is counted)",
    )
    validate.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="with --cost: the server's config file, for its [prices] table (default: the "
        "built-in estimates)",
    )
    _engine_args(validate)

    from comfyfleet.cli.emulate import add_emulate_parser
    from comfyfleet.cli.pack import add_pack_parser
    from comfyfleet.cli.serve import add_serve_parser
    from comfyfleet.cli.worker import add_worker_parser

    add_serve_parser(commands)
    add_emulate_parser(commands)
    add_worker_parser(commands)
    add_pack_parser(commands)

    nodes = commands.add_parser(
        "nodes",
        help="list the loaded nodes and packs that failed",
        description="A table in a terminal; one tab-separated line per node otherwise.",
        formatter_class=HelpFormatter,
    )
    nodes.add_argument("--json", action="store_true", help="print object_info and failures as JSON")
    _engine_args(nodes)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from comfyfleet.cli.serve import serve_main

        return serve_main(args)
    if args.command == "emulate-provider":
        from comfyfleet.cli.emulate import emulate_main

        return emulate_main(args)
    if args.command == "worker":
        from comfyfleet.cli.worker import worker_main

        return worker_main(args)
    if args.command == "install-comfyui-pack":
        from comfyfleet.cli.pack import install_pack

        return install_pack(args)
    if args.command == "nodes":
        from comfyfleet.cli.nodes import list_nodes

        return list_nodes(args)
    try:
        prompt = load_prompt(args.workflow)
    except WorkflowError as exc:
        print(json.dumps(exc.body(), indent=2), file=sys.stderr)
        return 2
    from comfyfleet.cli.run import run_workflow, validate_workflow

    if args.command == "validate":
        return asyncio.run(validate_workflow(args, prompt))
    return _run_interruptible(args, prompt, run_workflow)


def _run_interruptible(args: argparse.Namespace, prompt: dict[str, Any], runner: Any) -> int:
    """Ctrl-C interrupts the prompt (ending with execution_interrupted) instead of killing
    it: its paid jobs are cancelled at the provider, then the command exits 130."""
    from comfyfleet.engine.run import RunHandle

    handle = RunHandle()

    async def go() -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, handle.interrupt)
        try:
            code: int = await runner(args, prompt, handle)
            return INTERRUPTED if handle.interrupted else code
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
