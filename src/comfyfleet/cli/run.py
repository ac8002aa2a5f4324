"""`comfyfleet run` and `comfyfleet validate` on the built-in engine."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from comfyfleet.engine.events import EngineEvent, Message
from comfyfleet.engine.executor import Engine
from comfyfleet.engine.run import ExecutionResult, RunHandle
from comfyfleet.fanout import SERVICE, FanoutService, FanoutSettings, MemoryJournal, SecretVault
from comfyfleet.fanout.secrets import SERVICE as SECRETS
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from comfyfleet.protocol.errors import prompt_error_body


def _engine(args: argparse.Namespace, output_dir: Path | None = None) -> Engine:
    registry = build_registry(testing=args.testing_nodes, custom_nodes=args.custom_nodes)
    err = Console(stderr=True)
    for failure in registry.failures:
        err.print(f"[yellow]node pack {failure.pack} skipped:[/yellow] {failure.error}")
    output = (output_dir or Path("output")).resolve()
    folders = Folders(output=output, input=args.input_dir.resolve(), temp=output / ".temp")
    return Engine(registry, folders, services=_fanout().services())


def _fanout() -> FanoutService:
    """Paid API jobs for one run: pools sized by COMFYFLEET_* variables, a journal in
    memory (no request is sent twice within the run), keys from the environment or
    the file named by COMFYFLEET_SECRETS_FILE."""
    secrets_file = os.environ.get("COMFYFLEET_SECRETS_FILE") or None
    vault = SecretVault(Path(secrets_file) if secrets_file else None)
    return FanoutService(MemoryJournal(), vault, FanoutSettings.from_env(os.environ))


async def validate_workflow(args: argparse.Namespace, prompt: dict[str, Any]) -> int:
    engine = _engine(args)
    try:
        checked = await engine.validate(prompt)
    finally:
        engine.close()
    if not checked.ok:
        print(json.dumps(prompt_error_body(checked.error or {}, checked.node_errors), indent=2))
        return 1
    print(json.dumps({"outputs": checked.outputs, "node_errors": checked.node_errors}, indent=2))
    return 0


class _ProgressView:
    """A progress bar per prompt: nodes done out of nodes to run, and the current node."""

    def __init__(self, progress: Progress, prompt: dict[str, Any]) -> None:
        self.progress = progress
        self.prompt = prompt
        self.task: TaskID = progress.add_task("starting", total=None)

    def __call__(self, event: EngineEvent) -> None:
        if not isinstance(event, Message):
            return
        if event.type == "progress_state":
            nodes = event.data["nodes"]
            done = sum(1 for n in nodes.values() if n["state"] == "finished")
            running = [n for n in nodes.values() if n["state"] == "running"]
            label = "finishing"
            if running:
                node = running[-1]
                class_type = self.prompt[node["node_id"]]["class_type"]
                label = f"#{node['node_id']} {class_type} {node['value']:.4g}/{node['max']:.4g}"
            self.progress.update(
                self.task, completed=done, total=max(done, len(nodes)), description=label
            )


async def run_workflow(args: argparse.Namespace, prompt: dict[str, Any], handle: RunHandle) -> int:
    engine = _engine(args, args.output_dir)
    console = Console(stderr=True)
    try:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), console=console, disable=args.quiet
        ) as progress:
            view = _ProgressView(progress, prompt)
            # As the server does: a key typed into the workflow never reaches its outputs.
            vault = engine.services[SECRETS]
            prompt, _ = vault.scrub(prompt, {}, engine.registry)
            checked, result = await engine.run_prompt(prompt, sink=view, handle=handle)
    finally:
        await engine.services[SERVICE].close()
        engine.close()
    if result is None:
        print(json.dumps(prompt_error_body(checked.error or {}, checked.node_errors), indent=2))
        return 1
    if checked.node_errors:
        console.print("[yellow]some outputs failed validation and were skipped:[/yellow]")
        console.print_json(json.dumps(checked.node_errors))
    _report(result, engine, console)
    return 0 if result.completed else 1


def _report(result: ExecutionResult, engine: Engine, console: Console) -> None:
    for node_id, ui in result.outputs.items():
        for item in ui.get("images", []) if isinstance(ui, dict) else []:
            folder = engine.folders.of_type(item.get("type", "output")) or engine.folders.output
            print(folder / item.get("subfolder", "") / item["filename"])
        for text in ui.get("text", []) if isinstance(ui, dict) else []:
            print(f"#{node_id}: {text}")
    if result.status == "error" and result.error:
        err = result.error
        console.print(
            f"[red]node #{err['node_id']} {err['node_type']} failed:[/red] "
            f"{err['exception_type']}: {err['exception_message'].rstrip()}"
        )
    elif result.status == "interrupted":
        console.print("[yellow]interrupted[/yellow]")
    sys.stdout.flush()
