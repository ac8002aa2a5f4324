"""`make chaos`: randomized fault schedules against several gateways on a real
PostgreSQL, each checked once the faults are healed and the work has settled.

Each schedule starts fresh processes on a fresh database of a private PostgreSQL
cluster (never the machine's own): gateways g1..gN sharing the store, plain comfyfleet
backends b1..bK that every gateway is given (and a ComfyUI when COMFYUI_DIR and
COMFY_VENV are set), and a webhook receiver. Prompts are submitted at a steady rate
while the nemesis (nemesis.py) injects faults; then everything is healed, the run
settles, and the checker (checker.py) reads what happened and judges it. The figures go
to the terminal and to CHAOS.md. Every schedule's seed is printed: `--seed S
--schedules 1` replays it.

    .venv/bin/python chaos/run.py [--seed S] [--schedules 20] [--prompts 300]
        [--gateways 3] [--backends 2] [--lease 3] [--rate 6] [--faults kill-gateway,...]
        [--settle 240] [--report CHAOS.md] [--keep]
    .venv/bin/python chaos/run.py --rejudge DIR    # a kept schedule, judged again
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import audit
from checker import Window, judge, observe
from cluster import Cluster, Journal, Postgres, Settings, watch_machine
from nemesis import KINDS, Fault, Nemesis, plan
from receiver import Receiver, new_secret
from report import Outcome, Unplanned, faults_text, summary, write
from workload import Submitted, submit_all
from workload import plan as plan_prompts

ROOT = Path(__file__).resolve().parent.parent
ENDED = "completed,failed,interrupted,cancelled"


def options(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="the first schedule's seed")
    ap.add_argument("--schedules", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=300, help="prompts per schedule")
    ap.add_argument("--gateways", type=int, default=3)
    ap.add_argument("--backends", type=int, default=2, help="plain comfyfleet backends")
    ap.add_argument("--lease", type=float, default=3.0, help="the gateways' --lease, seconds")
    ap.add_argument("--rate", type=float, default=6.0, help="prompts submitted a second")
    ap.add_argument("--faults", default=",".join(KINDS), help="the kinds of fault to draw from")
    ap.add_argument("--settle", type=float, default=240.0, help="seconds to wait for every end")
    ap.add_argument("--report", type=Path, default=ROOT / "CHAOS.md")
    ap.add_argument("--keep", action="store_true", help="keep every schedule's files")
    ap.add_argument(
        "--rejudge", type=Path, help="judge a kept schedule's folder again (nothing runs)"
    )
    args = ap.parse_args(argv)
    unknown = set(args.faults.split(",")) - set(KINDS)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)}; known: {', '.join(KINDS)}")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    return args


def settings_of(args: argparse.Namespace) -> Settings:
    comfyui_dir, venv = os.environ.get("COMFYUI_DIR"), os.environ.get("COMFY_VENV")
    return Settings(
        gateways=args.gateways,
        backends=args.backends,
        lease=args.lease,
        hang_timeout=max(4.0, args.lease + 1.0),
        comfyui_dir=Path(comfyui_dir) if comfyui_dir and venv else None,
        comfyui_python=Path(venv) / "bin" / "python" if comfyui_dir and venv else None,
    )


def describe(settings: Settings, args: argparse.Namespace) -> str:
    comfyui = ", a ComfyUI backend" if settings.comfyui_dir else ""
    return (
        f"{args.schedules} schedules of {args.prompts} prompts ({args.rate:g} a second) on "
        f"{settings.gateways} gateways ({settings.local_slots} local slots each) and "
        f"{settings.backends} comfyfleet backends ({settings.backend_slots} slots each)"
        f"{comfyui}; lease {settings.lease:g} s, hang timeout {settings.hang_timeout:g} s; "
        f"faults drawn from {args.faults}"
    )


async def counts(urls: dict[str, str]) -> tuple[int, int] | None:
    """(ended, not yet ended) jobs, from the first gateway that answers."""
    timeout = aiohttp.ClientTimeout(total=3)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in urls.values():
            try:
                found = []
                for status in (ENDED, "pending,in_progress"):
                    async with session.get(f"{url}/api/jobs?status={status}&limit=1") as reply:
                        reply.raise_for_status()
                        found.append(int((await reply.json())["pagination"]["total"]))
                return found[0], found[1]
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                continue
    return None


async def until_ended(
    urls: dict[str, str], prompts: list[Submitted], submitting: asyncio.Task[None], limit: float
) -> bool:
    """Until every acknowledged prompt has ended (and the submits are done), or `limit`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = await counts(urls)
        acked = sum(p.acked_at is not None for p in prompts)
        if submitting.done() and found is not None and found == (acked, 0):
            return True
        await asyncio.sleep(1.0)
    return False


async def until_delivered(receiver: Receiver, prompts: list[Submitted], limit: float) -> None:
    wanted = {p.prompt_id for p in prompts if p.acked_at is not None}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not wanted <= set(receiver.ends()):
        await asyncio.sleep(0.5)


async def schedule(
    seed: int,
    args: argparse.Namespace,
    settings: Settings,
    pg: Postgres,
    receiver: Receiver,
    secret: str,
    folder: Path,
) -> Outcome:
    """One schedule: its processes are stopped at the end, whatever happens."""
    rng = random.Random(seed)  # drawn from in a fixed order: faults, prompts, gateways
    journal = Journal()
    pg.journal = journal
    cluster = Cluster(folder, pg, settings, journal, receiver.url)
    gateways = [f"g{n}" for n in range(1, settings.gateways + 1)]
    backends = [f"b{n}" for n in range(1, settings.backends + 1)]
    backends += ["comfyui"] if settings.comfyui_dir else []
    faults = plan(
        rng, args.faults.split(","), gateways, backends, settings.lease, settings.hang_timeout
    )
    prompts = plan_prompts(rng, args.prompts, args.rate, f"s{seed}")
    database = f"chaos_{seed}"
    await pg.drop_database(database)
    try:
        await cluster.start(database, secret, audit.install)
        outcome = await inject_and_check(seed, args, cluster, faults, prompts, rng, receiver)
    finally:
        await cluster.stop()
    (folder / "findings.txt").write_text("\n".join(outcome.verdict.problems) + "\n")
    if not args.keep and not outcome.verdict.failures() and outcome.settled:
        shutil.rmtree(folder, ignore_errors=True)
        await pg.drop_database(database)
    return outcome


async def inject_and_check(
    seed: int,
    args: argparse.Namespace,
    cluster: Cluster,
    faults: list[Fault],
    prompts: list[Submitted],
    rng: random.Random,
    receiver: Receiver,
) -> Outcome:
    urls = {name: server.url for name, server in cluster.gateways.items()}
    t0, began = time.time(), time.monotonic()
    stop, done = asyncio.Event(), asyncio.Event()
    nemesis = Nemesis(cluster, faults, began)
    injecting = asyncio.create_task(nemesis.run(stop))
    watching = asyncio.create_task(watch_machine(cluster.journal, done))
    submitting = asyncio.create_task(submit_all(prompts, urls, rng, give_up=120.0))
    try:
        # Faults go on while prompts are submitted or still running.
        await until_ended(urls, prompts, submitting, args.prompts / args.rate + 60.0)
    finally:
        stop.set()
        await injecting
        await cluster.heal()
    await submitting
    settled = await until_ended(urls, prompts, submitting, args.settle)
    # Late writes of processes that were paused land now, if they are to land at all.
    await asyncio.sleep(max(5.0, 2 * cluster.settings.lease))
    await until_delivered(receiver, prompts, 30.0)
    done.set()
    await watching
    unplanned = [
        Unplanned(s.action.split()[0], s.action, s.at - t0)
        for s in cluster.journal.entries
        if s.target == "machine"
    ]
    changes = await audit.read(cluster.store)
    folders = {name: server.folder for name, server in cluster.servers().items()}
    journal = cluster.journal.entries
    seen = await observe(prompts, urls, folders, changes, journal, receiver.received)
    seen.faults = sorted(
        [Window(i.fault.kind, i.describe(), i.at) for i in nemesis.injected]
        + [Window(u.kind, u.describe(), t0 + u.start) for u in unplanned],
        key=lambda w: w.start,
    )
    verdict = judge(seen, t0)
    # What was seen, for `--rejudge` (the processes are gone by then).
    with open(cluster.folder / "observation.pickle", "wb") as out:
        pickle.dump((seen, t0), out)
    duration = time.monotonic() - began
    return Outcome(seed, nemesis.injected, verdict, duration, settled, unplanned)


def line_of(n: int, total: int, outcome: Outcome) -> str:
    v = outcome.verdict
    verdict = "ok" if not v.failures() and outcome.settled else "FAILED"
    faults = faults_text(outcome.injected, outcome.unplanned)
    return (
        f"schedule {n}/{total} seed {outcome.seed}: {verdict} in {outcome.duration:.0f} s; "
        f"{v.prompts - v.unsent} prompts, lost {v.lost}, ran twice {v.ran_twice}, fenced-out "
        f"{v.fenced_out}, stale files {v.stale_files}, webhook ends missing "
        f"{v.webhook_missing}, ended twice {v.ended_twice}, history differs "
        f"{v.history_disagrees}, stream errors {v.stream_errors}, interrupted "
        f"{v.interrupted}, failed {v.failed}, re-runs "
        f"{v.reruns} ({v.cut_short} cut short); faults: {faults}"
    )


def rejudge(folder: Path) -> int:
    """Judge what a kept schedule saw again, with the checker as it is now."""
    with open(folder / "observation.pickle", "rb") as saved:
        seen, t0 = pickle.load(saved)
    verdict = judge(seen, t0)
    for problem in verdict.problems:
        print(problem)
    print(f"{verdict.failures()} failures: {verdict}".split(", problems=")[0])
    return 1 if verdict.failures() else 0


async def main(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    root = Path(tempfile.mkdtemp(prefix="comfyfleet-chaos-"))
    print(f"chaos: {describe(settings, args)}; seeds {args.seed}..; files in {root}", flush=True)
    pg = Postgres(root / "postgres", Journal())
    pg.init()
    pg.start()
    secret = new_secret()
    receiver = Receiver(secret)
    await receiver.start()
    command = "make chaos" + (f' ARGS="{" ".join(sys.argv[1:])}"' if sys.argv[1:] else "")
    outcomes: list[Outcome] = []
    try:
        for n in range(args.schedules):
            seed = args.seed + n
            print(f"schedule {n + 1}/{args.schedules}: seed {seed}", flush=True)
            folder = root / f"seed-{seed}"
            outcome = await schedule(seed, args, settings, pg, receiver, secret, folder)
            outcomes.append(outcome)
            print(line_of(n + 1, args.schedules, outcome), flush=True)
            for problem in outcome.verdict.problems[:10]:
                print(f"    {problem}", flush=True)
            if outcome.verdict.problems:
                print(f"    (all findings: {folder / 'findings.txt'})", flush=True)
            write(args.report, outcomes, describe(settings, args), command)
    finally:
        await receiver.close()
        pg.thaw()
        if pg.running():
            pg.stop()
        if not args.keep and all(not o.verdict.failures() and o.settled for o in outcomes):
            shutil.rmtree(root, ignore_errors=True)
    print(f"chaos: {summary(outcomes)}; report in {args.report}", flush=True)
    return 1 if any(o.verdict.failures() or not o.settled for o in outcomes) else 0


if __name__ == "__main__":
    chosen = options()
    sys.exit(rejudge(chosen.rejudge) if chosen.rejudge else asyncio.run(main(chosen)))
