"""`make conformance`: ComfyUI's own tests/execution suite in every configuration, and
CONFORMANCE.md written from the results.

    COMFYUI_DIR=... COMFY_VENV=... python conformance/report.py [--runs 2] [--only A,B]

Runs run_suite.sh once per configuration (the gateway ones `--runs` times), one after
another (they share ports 8188, 8190 and 8191), and writes CONFORMANCE.md at the top of
the checkout: ComfyUI's version, the date, the comfyfleet commit, the counts of each
run and every remaining failure with its reason (from KNOWN below; a failure not
there is listed as unexplained).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Config:
    label: str
    mode: str
    what: str
    pack: bool = True
    repeat: bool = True  # run `--runs` times (else once)


CONFIGS = [
    Config("baseline", "baseline", "ComfyUI alone", pack=False, repeat=False),
    Config("baseline-pack", "baseline-pack", "ComfyUI alone, companion pack loaded", repeat=False),
    Config("A", "A", "comfyfleet `--local-slots 0` + 1 ComfyUI backend with the pack"),
    Config("B", "B", "comfyfleet + 2 ComfyUI backends with the pack"),
    Config("A-nopack", "A", "comfyfleet + 1 ComfyUI backend, no pack", pack=False, repeat=False),
    Config("B-nopack", "B", "comfyfleet + 2 ComfyUI backends, no pack", pack=False, repeat=False),
    Config("C2", "C2", "comfyfleet alone: built-in engine, ComfyUI's testing nodes", repeat=False),
    Config(
        "W",
        "W",
        "comfyfleet `--local-slots 0` fed only by one `comfyfleet worker` bringing a ComfyUI "
        "with the pack",
        repeat=False,
    ),
]

#: Failures that are known differences, by test name (a regex over `Class::test[params]`),
#: per configuration label prefix, with their reason (as docs/differences.md gives it).
KNOWN: list[tuple[str, str, str]] = [
    (
        "-nopack",
        r"test_(async_validate_inputs|async_validation_error|validation_error_literal"
        r"|validation_error_kwargs)",
        "Without the companion pack the gateway cannot run a node's own VALIDATE_INPUTS: "
        "it answers 200, the backend refuses, and the prompt ends with an execution_error "
        "carrying the backend's node_errors (docs/features/backends.md: Failures).",
    ),
]


@dataclass
class Result:
    label: str
    run: int
    passed: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def read_junit(path: Path, label: str, run: int) -> Result:
    result = Result(label, run)
    root = ET.parse(path).getroot()
    for suite in [root] if root.tag == "testsuite" else list(root):
        result.seconds += float(suite.get("time", 0))
        for case in suite.iter("testcase"):
            name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                result.failed.append(name)
            elif case.find("skipped") is None:
                result.passed += 1
    return result


def run_label(config: Config, run: int) -> str:
    return config.label if run == 1 else f"{config.label}-run{run}"


def run_config(config: Config, run: int, out_dir: Path) -> Result:
    label = run_label(config, run)
    env = {
        **os.environ,
        "OUT_DIR": str(out_dir),
        "CF_LABEL": label,
        "CF_PACK": "1" if config.pack else "0",
    }
    print(f"== {label}: {config.what}", flush=True)
    subprocess.run(
        ["bash", str(HERE / "run_suite.sh"), config.mode],
        env=env,
        stdout=subprocess.DEVNULL,
        check=False,
    )
    result = read_junit(out_dir / f"{label}.xml", config.label, run)
    print(f"   {result.passed} passed, {len(result.failed)} failed", flush=True)
    return result


def reason(label: str, test: str) -> str:
    for suffix, pattern, why in KNOWN:
        if label.endswith(suffix) and re.search(pattern, test):
            return why
    return "**unexplained**"


def comfyui_version(comfyui: Path) -> str:
    text = (comfyui / "comfyui_version.py").read_text(encoding="utf-8")
    found = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    return found.group(1) if found else "unknown"


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip()


def report(results: list[Result], comfyui: Path, command: str) -> str:
    by_label: dict[str, list[Result]] = {}
    for result in results:
        by_label.setdefault(result.label, []).append(result)
    commit = os.environ.get("COMFYUI_COMMIT", "not given (set COMFYUI_COMMIT)")
    lines = [
        "# Conformance: ComfyUI's own execution suite through comfyfleet",
        "",
        f"- ComfyUI {comfyui_version(comfyui)}, commit {commit}, CPU",
        f"- comfyfleet {git('rev-parse', '--short', 'HEAD')} ({git('log', '-1', '--format=%cs')})",
        f"- run on {time.strftime('%Y-%m-%d')} with `{command}`",
        "- the suite: `tests/execution` of that ComfyUI, unchanged (185 tests); the harness is",
        "  `conformance/` (its README says how each configuration is set up)",
        "",
        "| configuration | runs: passed / failed | time |",
        "|---|---|---|",
    ]
    for config in CONFIGS:
        runs = by_label.get(config.label)
        if not runs:
            continue
        counts = ", ".join(f"{r.passed} / {len(r.failed)}" for r in runs)
        seconds = ", ".join(f"{r.seconds:.0f} s" for r in runs)
        lines.append(f"| {config.label}: {config.what} | {counts} | {seconds} |")
    lines += ["", "## Remaining failures", ""]
    grouped: dict[tuple[str, int, str], list[str]] = {}
    for r in results:
        for test in r.failed:
            grouped.setdefault((r.label, r.run, reason(r.label, test)), []).append(test)
    if not grouped:
        lines.append("None.")
    for (label, run, why), tests in grouped.items():
        lines += [f"- **{label}** (run {run}), {len(tests)} tests: {why}", ""]
        lines += [f"  - `{test}`" for test in tests] + [""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2, help="runs of each gateway configuration")
    parser.add_argument("--only", default="", help="comma-separated labels (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "conformance-results")
    parser.add_argument(
        "--report-only", action="store_true", help="write CONFORMANCE.md from the results in --out"
    )
    args = parser.parse_args()
    for name in ("COMFYUI_DIR", "COMFY_VENV", "CF_BIN"):
        if not os.environ.get(name):
            print(f"set {name} (see conformance/README.md)", file=sys.stderr)
            return 2
    only = {label for label in args.only.split(",") if label}
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for config in CONFIGS:
        if only and config.label not in only:
            continue
        for run in range(1, (args.runs if config.repeat else 1) + 1):
            if args.report_only:
                xml = args.out / f"{run_label(config, run)}.xml"
                if xml.exists():
                    results.append(read_junit(xml, config.label, run))
            else:
                results.append(run_config(config, run, args.out))
    command = "make conformance" + (f" ARGS='--only {args.only}'" if args.only else "")
    text = report(results, Path(os.environ["COMFYUI_DIR"]), command)
    (ROOT / "CONFORMANCE.md").write_text(text, encoding="utf-8")
    print(text)
    return 0 if all(reason(r.label, t) != "**unexplained**" for r in results for t in r.failed) else 1


if __name__ == "__main__":
    sys.exit(main())
