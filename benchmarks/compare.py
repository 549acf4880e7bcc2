"""Compare the overhead workloads of a base commit (A) with the working tree (B).

    python benchmarks/compare.py main                     # 5 rounds of every overhead workload
    python benchmarks/compare.py HEAD~3 --rounds 9 --only W2 W4
    make bench-compare                                    # against main

The base commit is checked out in a temporary git worktree; both sides run with the current
virtual environment, the base with ``PYTHONPATH`` pointing at its checkout (so ``import minions``
is the base's code) and the working tree with ``PYTHONPATH`` at the working tree, uncommitted
changes included. By default both sides run the working tree's benchmark scripts, so only the
code under them differs; ``--base-scripts`` runs the base's own scripts instead (for a base
whose API the current scripts no longer fit).

Each round runs every workload once per side, in fresh processes and in the order A, B, A, B...
so that a machine busy for a while slows both sides alike. For every workload, variant and
metric the table shows the median over the rounds of each side's value (each value is already
the median of that process's repetitions), the ratio B/A of those medians, and its spread: the
quartiles of the per-round ratios B_i/A_i (a round's A and B ran back to back). A ratio beyond
the threshold is flagged; ``SLOWER``/``FASTER`` when three rounds in four agree on the
direction, with a ``?`` when they do not (noise). The exit code is 1 when any metric is flagged
``SLOWER``, 2 for a usage error.

``MINIONS_BENCH_QUICK=1`` is set for the runs: W4 then skips its HTTP variants (a minute each
run; their share of minions' own cost is the core path the headline measures).

See docs/benchmarks.md ("Comparing two commits").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from run import WORKLOADS  # the scripts' names (benchmarks/ is on the path of a script in it)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

OVERHEAD = ("W1", "W2", "W3", "W4", "W5", "IMPORT", "W1-OTEL")
"""The workloads compared by default: the framework's own overhead."""

EXTRAS = {"ratio_to_untraced": "x", "framework_ms": "ms", "us_per_step_k0": "us"}
"""Numbers from a line's ``extra`` compared as well: W1-OTEL's cost relative to untraced in
the same process, W3's makespan beyond bare asyncio's, W2's step with one model call and no
tools (no fit, no thread)."""

MIN_FIRM = 3
"""Paired rounds needed before a flag is firm (no ``?``)."""

Key = tuple[str, str, str]
"""(workload, variant, metric)"""
Round = dict[Key, float]


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of the table: a metric of a variant, both sides over the rounds."""

    workload: str
    variant: str
    metric: str
    unit: str
    a: float | None
    b: float | None
    n_a: int
    n_b: int
    ratio: float | None
    """median(B) / median(A); None when A's median is not positive."""
    q1: float | None
    q3: float | None
    """Quartiles of the per-round ratios B_i/A_i."""
    flag: str


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks/compare.py",
        description="Run the overhead workloads for BASE_REF (A) and the working tree (B), "
        "interleaved, and print medians and ratios.",
    )
    parser.add_argument("base", metavar="BASE_REF", help="commit, branch or tag to compare with")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of A then B per workload (default: 5)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="WORKLOAD",
        help=f"workloads to run (default: {' '.join(OVERHEAD)})",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.10,
        help="flag ratios beyond 1 +/- this (default: 0.10)",
    )
    parser.add_argument(
        "--base-scripts",
        action="store_true",
        help="run the base's own benchmark scripts for A (default: the working tree's for both)",
    )
    parser.add_argument("--raw", type=Path, metavar="FILE", help="write every JSON line here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 0 < args.threshold < 1:
        parser.error("--threshold must be between 0 and 1")
    args.only = [name.upper() for name in args.only or OVERHEAD]
    unknown = [name for name in args.only if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    return args


def collect(requested: str, lines: Iterable[str]) -> Round:
    """The numbers of one run of `requested` from its JSON lines (other lines are ignored)."""
    values: Round = {}
    for text in lines:
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if not isinstance(line, dict) or "metrics" not in line:
            continue
        # W3 prints W3a and W3b; W1-OTEL prints lines of workload W1, kept apart from W1's.
        workload = line["workload"]
        if not workload.startswith(requested):
            workload = requested
        variant = line["variant"]
        for metric, summary in line["metrics"].items():
            # A process's median of its repetitions, or its one value (SERVICE measures once).
            values[workload, variant, metric] = float(summary.get("median", summary.get("value")))
        for name in EXTRAS:
            value = line.get("extra", {}).get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                values[workload, variant, name] = float(value)
    return values


def unit_of(metric: str, units: dict[str, str]) -> str:
    return units.get(metric) or EXTRAS.get(metric) or ""


LOADS = ("queries", "xacts", "statements", "notifies", "writes")
"""Words of metrics that count what something costs a second (an idle worker's statements,
a server's transactions): fewer is better, though they are numbers a second."""


def higher_is_better(metric: str) -> bool:
    """A throughput (runs a second, a speed-up) is better higher; a time, a size or a load
    a second (`LOADS`) lower."""
    if any(word in metric.split("_") for word in LOADS):
        return False
    return metric.endswith("_per_s") or metric in ("speedup", "runs")


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) == 1:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def flag_of(
    metric: str,
    ratio: float | None,
    q1: float | None,
    q3: float | None,
    t: float,
    *,
    firm: bool = True,
) -> str:
    """``SLOWER``/``FASTER`` when the ratio is beyond 1 +/- `t` and three rounds in four agree;
    with a ``?`` when they do not, or when there are too few rounds (`firm` False) to say."""
    if ratio is None or q1 is None or q3 is None:
        return ""
    worse, better = ratio > 1 + t, ratio < 1 / (1 + t)
    if higher_is_better(metric):
        worse, better = better, worse
        q1, q3 = 1 / q3, 1 / q1  # read as costs from here on
    if worse:
        return "SLOWER" if firm and q1 > 1 else "slower?"
    if better:
        return "FASTER" if firm and q3 < 1 else "faster?"
    return ""


def summarize(
    rounds_a: list[Round], rounds_b: list[Round], units: dict[str, str], threshold: float
) -> list[Row]:
    """One row per key seen on either side, in the order the scripts printed them."""
    keys = dict.fromkeys(k for r in [*rounds_a, *rounds_b] for k in r)
    rows = []
    for key in keys:
        a_values = [r[key] for r in rounds_a if key in r]
        b_values = [r[key] for r in rounds_b if key in r]
        a = statistics.median(a_values) if a_values else None
        b = statistics.median(b_values) if b_values else None
        # A ratio of costs means something only when both are positive: a difference of two
        # timings (W4's) can come out at or below zero when it is within the noise.
        ratio = b / a if a is not None and b is not None and a > 0 and b > 0 else None
        paired = [
            rb[key] / ra[key]
            for ra, rb in zip(rounds_a, rounds_b, strict=True)
            if key in ra and key in rb and ra[key] > 0 and rb[key] > 0
        ]
        q1, q3 = quartiles(paired) if paired and ratio is not None else (None, None)
        firm = len(paired) >= MIN_FIRM
        workload, variant, metric = key
        rows.append(
            Row(
                workload=workload,
                variant=variant,
                metric=metric,
                unit=unit_of(metric, units),
                a=a,
                b=b,
                n_a=len(a_values),
                n_b=len(b_values),
                ratio=ratio,
                q1=q1,
                q3=q3,
                flag=flag_of(metric, ratio, q1, q3, threshold, firm=firm),
            )
        )
    return rows


def number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def format_table(rows: list[Row], rounds: int) -> str:
    """A Markdown table; a side with fewer values than rounds says how many it has."""
    lines = [
        "| workload | variant | metric | A | B | B/A | spread | flag |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        unit = f" {row.unit}" if row.unit and row.unit != "x" else ""
        a, b = number(row.a) + unit, number(row.b) + unit
        if row.n_a != rounds:
            a += f" (n={row.n_a})"
        if row.n_b != rounds:
            b += f" (n={row.n_b})"
        ratio = "-" if row.ratio is None else f"{row.ratio:.3f}"
        spread = "" if row.q1 is None else f"{row.q1:.3f}-{row.q3:.3f}"
        lines.append(
            f"| {row.workload} | {row.variant} | {row.metric} | {a} | {b} | {ratio} | "
            f"{spread} | {row.flag} |"
        )
    return "\n".join(lines)


def git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


@contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """`commit` in a temporary git worktree, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="minions-compare-"))
    tree = parent / "base"
    git("worktree", "add", "--detach", "--quiet", str(tree), commit)
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True, check=False)


def environment(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    env["MINIONS_BENCH_QUICK"] = "1"
    return env


def prepare(tree: Path) -> None:
    """Compile the tree's modules (a fresh checkout has no bytecode: its first imports would
    pay for it) and check that its ``minions`` is the one imported."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(tree / "minions"), str(tree / "benchmarks")],
        check=False,
        capture_output=True,
    )
    found = subprocess.run(
        [sys.executable, "-c", "import minions; print(minions.__file__)"],
        cwd=tree,
        env=environment(tree),
        capture_output=True,
        text=True,
        check=False,
    )
    path = Path(found.stdout.strip() or ".").resolve()
    if found.returncode != 0 or not path.is_relative_to(tree.resolve()):
        raise SystemExit(
            f"importing minions with PYTHONPATH={tree} gave {path} "
            f"(exit {found.returncode}): {found.stderr.strip()[-500:]}"
        )


def run_once(script: Path, tree: Path) -> tuple[list[str], str | None]:
    """One fresh process of `script` against `tree`: its stdout lines, and an error or None."""
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tree,  # IMPORT's `python -c` children find `minions` in their working directory
        env=environment(tree),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-3:]
        return [], f"exit {result.returncode}: {' / '.join(tail)}"
    return result.stdout.splitlines(), None


def describe(ref: str, commit: str) -> str:
    subject = git("log", "-1", "--format=%h %cs %s", commit)
    return f"{ref} = {subject[:90]}"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{args.base}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        print(f"compare.py: {args.base!r} names no commit of this repository", file=sys.stderr)
        return 2
    commit = found.stdout.strip()
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    rounds_a: list[Round] = []
    rounds_b: list[Round] = []
    units: dict[str, str] = {}
    raw = args.raw.open("w") if args.raw else None
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with checkout(commit) as base:
        prepare(base)
        prepare(ROOT)
        scripts_a = base / "benchmarks" if args.base_scripts else HERE
        for number_ in range(1, args.rounds + 1):
            round_a: Round = {}
            round_b: Round = {}
            for name in args.only:
                for side, tree, scripts, into in (
                    ("A", base, scripts_a, round_a),
                    ("B", ROOT, HERE, round_b),
                ):
                    script = scripts / WORKLOADS[name]
                    if not script.exists():
                        print(f"{name} {side}: no {script}", file=sys.stderr)
                        continue
                    lines, error = run_once(script, tree)
                    if error:
                        print(f"round {number_} {name} {side}: {error}", file=sys.stderr)
                    into.update(collect(name, lines))
                    for text in lines:
                        if text.startswith("{"):
                            line = json.loads(text)
                            for metric, summary in line.get("metrics", {}).items():
                                units.setdefault(metric, summary.get("unit", ""))
                            if raw:
                                line["compare"] = {"side": side, "round": number_}
                                raw.write(json.dumps(line) + "\n")
            rounds_a.append(round_a)
            rounds_b.append(round_b)
            elapsed = time.monotonic() - started
            print(f"round {number_}/{args.rounds} done ({elapsed:.0f} s)", file=sys.stderr)
    if raw:
        raw.close()
    rows = summarize(rounds_a, rounds_b, units, args.threshold)
    print(f"A: {describe(args.base, commit)}")
    print(f"B: working tree of {describe('HEAD', 'HEAD')}{dirty}")
    print(
        f"{args.rounds} rounds, A then B in fresh processes; Python {sys.version.split()[0]}; "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"threshold {args.threshold:.0%}\n"
    )
    print(format_table(rows, args.rounds))
    return 1 if any(row.flag == "SLOWER" for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
