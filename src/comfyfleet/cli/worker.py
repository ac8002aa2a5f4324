"""`comfyfleet worker`: join a gateway's fleet from anywhere, connecting out only."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from comfyfleet.managed.spec import comfyui_python, visible_gpus
from comfyfleet.workers.agent import WorkerAgent, WorkerSettings, connect_url
from comfyfleet.workers.local_backend import LocalBackend
from comfyfleet.workers.tokens import NAME

TOKEN_ENV = "COMFYFLEET_WORKER_TOKEN"
log = logging.getLogger("comfyfleet.worker")


def add_worker_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from comfyfleet.cli import HelpFormatter

    worker = commands.add_parser(
        "worker",
        help="join a gateway's fleet, connecting out to it (behind NAT or a firewall)",
        description="Connects to the gateway (the only connection it makes there), brings a "
        "backend, and runs the prompts the gateway gives it through that connection. "
        "SIGTERM drains: the running prompts finish within --grace, then it exits 0.",
        formatter_class=HelpFormatter,
    )
    worker.add_argument("--gateway", required=True, help="the gateway's URL, http(s)://host:port")
    worker.add_argument(
        "--token",
        help=f"the worker token (better: the {TOKEN_ENV} variable, out of the process list)",
    )
    worker.add_argument(
        "--name", default="", help="this worker's name under its token (workers sharing one)"
    )
    brings = worker.add_mutually_exclusive_group(required=True)
    brings.add_argument("--backend", help="a ComfyUI (or comfyfleet) running beside it, its URL")
    brings.add_argument(
        "--local-slots", type=int, help="run prompts with the built-in engine, N at once"
    )
    brings.add_argument(
        "--comfyui", type=Path, metavar="DIR", help="start the ComfyUI in DIR and run prompts there"
    )
    worker.add_argument(
        "--comfyui-python",
        metavar="PYTHON",
        help="with --comfyui: its interpreter (default: DIR's venv, else this Python)",
    )
    worker.add_argument(
        "--gpu", default=None, help="with --comfyui: a GPU id, or cpu (default: 0, cpu without one)"
    )
    worker.add_argument(
        "--comfyui-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --comfyui: one more of ComfyUI's flags (repeatable: --comfyui-arg=--lowvram)",
    )
    worker.add_argument(
        "--slots",
        type=int,
        default=1,
        help="with --backend or --comfyui: the prompts it runs at once",
    )
    worker.add_argument("--testing-nodes", action="store_true", help="with --local-slots")
    worker.add_argument(
        "--custom-nodes", action="append", default=[], metavar="DIR", help="with --local-slots"
    )
    worker.add_argument(
        "--data-dir",
        type=Path,
        default=Path("worker-data"),
        help="the built-in engine's files, or ComfyUI's input, output and temp folders",
    )
    worker.add_argument(
        "--grace", type=float, default=30.0, help="seconds a SIGTERM waits for running prompts"
    )
    worker.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")


def worker_main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    token = args.token or os.environ.get(TOKEN_ENV, "")
    problem = _problem(args, token)
    if problem:
        print(f"comfyfleet worker: {problem}", file=sys.stderr)
        return 2
    return asyncio.run(_work(args, token))


def _problem(args: argparse.Namespace, token: str) -> str | None:
    if not token:
        return f"give the worker token: --token or {TOKEN_ENV}"
    try:
        connect_url(args.gateway)
    except ValueError as exc:
        return str(exc)
    if args.name and not NAME.fullmatch(args.name):
        return "--name: 1 to 64 letters, digits, '.', '_' or '-'"
    if args.local_slots is not None and not 1 <= args.local_slots <= 256:
        return "--local-slots must be 1 to 256"
    if not 1 <= args.slots <= 256:
        return "--slots must be 1 to 256"
    if not 0 <= args.grace <= 3600:
        return "--grace must be 0 to 3600 seconds"
    if args.comfyui is not None and not (args.comfyui / "main.py").is_file():
        return f"--comfyui: no ComfyUI in {args.comfyui} (no main.py)"
    return None


def _gpu(chosen: str | None) -> str:
    if chosen is not None:
        return chosen
    return "0" if visible_gpus(os.environ) else "cpu"


async def _local_backend(args: argparse.Namespace) -> LocalBackend | None:
    data_dir = args.data_dir.resolve()
    if args.local_slots is not None:
        extra = ["--testing-nodes"] if args.testing_nodes else []
        for folder in args.custom_nodes:
            extra += ["--custom-nodes", folder]
        return LocalBackend.engine(data_dir, args.local_slots, extra)
    if args.comfyui is not None:
        folder, gpu = args.comfyui.resolve(), _gpu(args.gpu)
        python = comfyui_python(args.comfyui_python, folder, Path.cwd(), "--comfyui-python")
        # The companion pack is copied into the data dir: files, off the event loop.
        return await asyncio.to_thread(
            LocalBackend.comfyui, folder, python, gpu, data_dir, args.comfyui_arg
        )
    return None


async def _work(args: argparse.Namespace, token: str) -> int:
    local = await _local_backend(args)
    if local is not None:
        await local.start()
    settings = WorkerSettings(
        gateway=args.gateway,
        token=token,
        name=args.name,
        slots=args.local_slots or args.slots,
        backend=local.url if local else args.backend,
        grace=args.grace,
    )
    # Past the grace, a backend of its own is killed: what it ran goes back to the queue.
    agent = WorkerAgent(settings, local.kill if local is not None else None)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, agent.stopping.set)
    try:
        return await agent.run()
    finally:
        if local is not None:
            await local.stop()
