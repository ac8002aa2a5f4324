"""The `comfyfleet` command: serve, run, validate, list nodes, install the ComfyUI pack."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from comfyfleet.cli.workflow_file import WorkflowError, apply_overrides, load_prompt


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="comfyfleet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="execute a workflow (API format) locally")
    run.add_argument("workflow", type=Path)
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NODE.INPUT=VALUE",
        help="override an input (VALUE is JSON, or a plain string)",
    )
    run.add_argument("--output-dir", type=Path, default=Path("output"))
    run.add_argument("--input-dir", type=Path, default=Path("input"))
    run.add_argument("--quiet", action="store_true", help="no progress display")
    _engine_args(run)

    validate = commands.add_parser("validate", help="validate a workflow without running it")
    validate.add_argument("workflow", type=Path)
    validate.add_argument("--set", action="append", default=[], metavar="NODE.INPUT=VALUE")
    validate.add_argument("--input-dir", type=Path, default=Path("input"))
    _engine_args(validate)

    from comfyfleet.cli.emulate import add_emulate_parser
    from comfyfleet.cli.pack import add_pack_parser
    from comfyfleet.cli.serve import add_serve_parser

    add_serve_parser(commands)
    add_emulate_parser(commands)
    add_pack_parser(commands)

    nodes = commands.add_parser("nodes", help="list the loaded nodes and packs that failed")
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
    if args.command == "install-comfyui-pack":
        from comfyfleet.cli.pack import install_pack

        return install_pack(args)
    if args.command == "nodes":
        from comfyfleet.cli.nodes import list_nodes

        return list_nodes(args)
    try:
        prompt = apply_overrides(load_prompt(args.workflow), args.set)
    except WorkflowError as exc:
        _print_json(exc.body(), sys.stderr)
        return 2
    from comfyfleet.cli.run import run_workflow, validate_workflow

    if args.command == "validate":
        return asyncio.run(validate_workflow(args, prompt))
    return _run_interruptible(args, prompt, run_workflow)


def _run_interruptible(args: argparse.Namespace, prompt: dict[str, Any], runner: Any) -> int:
    """Ctrl-C interrupts the prompt (ending with execution_interrupted) instead of killing it."""
    from comfyfleet.engine.run import RunHandle

    handle = RunHandle()

    async def go() -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, handle.interrupt)
        try:
            code: int = await runner(args, prompt, handle)
            return code
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(go())


def _print_json(body: Any, stream: Any = None) -> None:
    print(json.dumps(body, indent=2), file=stream or sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
