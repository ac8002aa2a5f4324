"""`comfyfleet run` and `comfyfleet validate` on the built-in engine."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from comfyfleet.cli.costs import print_cost
from comfyfleet.cli.journal import open_journal
from comfyfleet.cli.summary import display_names, nodes_to_run, validation_summary
from comfyfleet.cli.workflow_file import WorkflowError, apply_overrides
from comfyfleet.engine.events import EngineEvent, NodeProgress
from comfyfleet.engine.executor import Engine
from comfyfleet.engine.run import ExecutionRequest, ExecutionResult, RunHandle
from comfyfleet.engine.validation import ValidationResult
from comfyfleet.fanout import SERVICE, FanoutService, FanoutSettings, MemoryJournal, SecretVault
from comfyfleet.fanout.secrets import SERVICE as SECRETS
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from comfyfleet.nodes.providers import DRIVERS
from comfyfleet.protocol.errors import prompt_error_body
from comfyfleet.store.base import RemoteJobJournal

#: Running nodes named in the progress line; the others are counted.
SHOWN_RUNNING = 3


def _engine(
    args: argparse.Namespace, journal: RemoteJobJournal, output_dir: Path | None = None
) -> Engine:
    registry = build_registry(testing=args.testing_nodes, custom_nodes=args.custom_nodes)
    err = Console(stderr=True)
    for failure in registry.failures:
        err.print(f"[yellow]node pack {failure.pack} skipped:[/yellow] {failure.error}")
    output = (output_dir or Path("output")).resolve()
    folders = Folders(output=output, input=args.input_dir.resolve(), temp=output / ".temp")
    return Engine(registry, folders, services=_fanout(journal).services())


def _fanout(journal: RemoteJobJournal) -> FanoutService:
    """Paid API jobs for one run: pools sized by COMFYFLEET_* variables, keys from the
    environment or the file named by COMFYFLEET_SECRETS_FILE. A job is re-attached from
    the journal only when this run asks for it (another run may be following the rest)."""
    secrets_file = os.environ.get("COMFYFLEET_SECRETS_FILE") or None
    vault = SecretVault(Path(secrets_file) if secrets_file else None)
    settings = FanoutSettings.from_env(os.environ)
    return FanoutService(journal, vault, settings, DRIVERS, resume=False)


def _overridden(
    args: argparse.Namespace, prompt: dict[str, Any], engine: Engine
) -> dict[str, Any] | None:
    """The prompt with `--set` applied, or None (reported) when one cannot be."""
    try:
        return apply_overrides(prompt, args.set, display_names(engine.registry))
    except WorkflowError as exc:
        print(json.dumps(exc.body(), indent=2), file=sys.stderr)
        return None


def _refused(checked: ValidationResult, prompt: dict[str, Any], engine: Engine) -> int:
    """Report a prompt that failed validation: one line per problem on stderr, then
    ComfyUI's JSON error body on stdout."""
    for line in validation_summary(checked, prompt, engine.registry):
        print(f"comfyfleet: {line}", file=sys.stderr)
    print(json.dumps(prompt_error_body(checked.error or {}, checked.node_errors), indent=2))
    return 1


async def validate_workflow(args: argparse.Namespace, prompt: dict[str, Any]) -> int:
    engine = _engine(args, MemoryJournal())
    try:
        overridden = _overridden(args, prompt, engine)
        if overridden is None:
            return 2
        checked = await engine.validate(overridden)
    finally:
        engine.close()
    if not checked.ok:
        return _refused(checked, overridden, engine)
    if getattr(args, "cost", False):
        return print_cost(checked, engine, args.config)
    print(json.dumps({"outputs": checked.outputs, "node_errors": checked.node_errors}, indent=2))
    return 0


class NodeTally:
    """The nodes a prompt has finished and is running, kept change by change (a
    `progress_state` frame lists every node: reading it on each change would cost a
    wide prompt O(N²))."""

    def __init__(self) -> None:
        self.finished: set[str] = set()
        self.running: dict[str, dict[str, Any]] = {}  # in the order they started

    def change(self, node_id: str, entry: dict[str, Any]) -> None:
        if entry["state"] == "finished":
            self.running.pop(node_id, None)
            self.finished.add(node_id)
        else:
            self.running[node_id] = entry

    def line(self, prompt: dict[str, Any], total: int) -> tuple[int, int, str]:
        """(nodes done, nodes to run, what runs now)."""
        parts = []
        for node in itertools.islice(self.running.values(), SHOWN_RUNNING):
            source = prompt.get(node.get("real_node_id") or node["node_id"], {})
            parts.append(
                f"#{node['node_id']} {source.get('class_type', '?')} "
                f"{node['value']:.4g}/{node['max']:.4g}"
            )
        if len(self.running) > SHOWN_RUNNING:
            parts.append(f"+{len(self.running) - SHOWN_RUNNING} more running")
        done = len(self.finished)
        return done, max(total, done + len(self.running)), ", ".join(parts) or "nodes"


class _ProgressView:
    """One bar per prompt: nodes done out of the nodes it runs, and what runs now."""

    def __init__(self, progress: Progress, prompt: dict[str, Any], total: int) -> None:
        self.progress = progress
        self.prompt = prompt
        self.total = total
        self.tally = NodeTally()
        self.task: TaskID = progress.add_task("starting", total=total)

    def __call__(self, event: EngineEvent) -> None:
        if isinstance(event, NodeProgress):
            self.tally.change(event.node_id, event.entry)
            done, total, label = self.tally.line(self.prompt, self.total)
            self.progress.update(self.task, completed=done, total=total, description=label)


@asynccontextmanager
async def _fanout_for_run(engine: Engine, handle: RunHandle, keeps: bool) -> AsyncIterator[None]:
    """At the end of a run, jobs still running are cancelled (Ctrl-C, or a journal in
    memory that would forget them), else left to the journal file for the next run."""
    service = engine.services.get(SERVICE)
    assert service is not None  # the engine was built with the fan-out services
    try:
        yield
    finally:
        if keeps and not handle.interrupted:
            await service.detach()
        else:
            await service.close()


async def run_workflow(args: argparse.Namespace, prompt: dict[str, Any], handle: RunHandle) -> int:
    async with open_journal(args) as opened:
        if opened is None:
            return 2
        journal, keeps = opened
        engine = _engine(args, journal, args.output_dir)
        try:
            async with _fanout_for_run(engine, handle, keeps):
                return await _run(args, prompt, handle, engine)
        finally:
            engine.close()


async def _run(
    args: argparse.Namespace, prompt: dict[str, Any], handle: RunHandle, engine: Engine
) -> int:
    overridden = _overridden(args, prompt, engine)
    if overridden is None:
        return 2
    # As the server does: a key typed into the workflow never reaches its outputs.
    vault = engine.services.get(SECRETS)
    assert vault is not None
    overridden, _ = vault.scrub(overridden, {}, engine.registry)
    checked = await engine.validate(overridden)
    if not checked.ok:
        return _refused(checked, overridden, engine)
    console = Console(stderr=True)
    # Outside a terminal a bar cannot redraw: it would leave only its last state behind.
    shown = not args.quiet and console.is_terminal
    request = ExecutionRequest(str(uuid.uuid4()), checked.prompt, checked.outputs)
    total = nodes_to_run(checked.prompt, checked.outputs)
    with Progress(
        TextColumn("{task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("{task.description}"),
        console=console,
        disable=not shown,
        transient=True,
    ) as progress:
        view = _ProgressView(progress, checked.prompt, total)
        result = await engine.execute(request, sink=view, handle=handle)
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
