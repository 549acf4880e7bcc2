"""benchmarks/compare.py: its arguments, and the table it makes of results (no timings run)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def compare() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_compare", BENCHMARKS / "compare.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_compare"] = module  # dataclasses look their module up by name
    sys.path.insert(0, str(BENCHMARKS))  # as when it runs as a script: it imports run.py
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def line(workload: str, variant: str, metrics: dict[str, float], **extra: Any) -> str:
    return json.dumps(
        {
            "workload": workload,
            "variant": variant,
            "metrics": {m: {"median": v, "unit": "us"} for m, v in metrics.items()},
            "extra": extra,
        }
    )


def test_defaults_are_the_overhead_workloads(compare: ModuleType) -> None:
    args = compare.parse_args(["main"])
    assert args.base == "main"
    assert args.rounds == 5
    assert args.threshold == 0.10
    assert args.only == ["W1", "W2", "W3", "W4", "W5", "IMPORT", "W1-OTEL"]
    assert not args.base_scripts


def test_workloads_are_named_in_any_case(compare: ModuleType) -> None:
    args = compare.parse_args(["HEAD~2", "--only", "w2", "w1-otel", "--rounds", "9"])
    assert args.only == ["W2", "W1-OTEL"]
    assert args.rounds == 9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["main", "--only", "W9"], "unknown workload(s): W9"),
        (["main", "--rounds", "0"], "--rounds must be at least 1"),
        (["main", "--threshold", "1.5"], "--threshold must be between 0 and 1"),
        ([], "BASE_REF"),
    ],
)
def test_bad_arguments_exit_2_saying_why(
    compare: ModuleType, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        compare.parse_args(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_a_ref_naming_no_commit_exits_2(
    compare: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare.main(["no-such-ref-anywhere", "--only", "W5", "--rounds", "1"]) == 2
    assert "'no-such-ref-anywhere' names no commit" in capsys.readouterr().err


def test_collect_keys_lines_by_workload_variant_and_metric(compare: ModuleType) -> None:
    lines = [
        "running W3 (w3_parallel.py)...",
        line("W3a", "AgentExecutor.execute", {"ratio_to_ideal": 1.01}, framework_ms=1.2),
        line("W3b", "AgentExecutor.execute", {"ratio_to_ideal": 1.02}, framework_ms=3.0),
    ]
    assert compare.collect("W3", lines) == {
        ("W3a", "AgentExecutor.execute", "ratio_to_ideal"): 1.01,
        ("W3a", "AgentExecutor.execute", "framework_ms"): 1.2,
        ("W3b", "AgentExecutor.execute", "ratio_to_ideal"): 1.02,
        ("W3b", "AgentExecutor.execute", "framework_ms"): 3.0,
    }
    # W1-OTEL prints lines of workload W1: they stay apart from W1's own.
    traced = [line("W1", "traced", {"us_per_step": 90.0}, ratio_to_untraced=1.4, steps=50)]
    assert compare.collect("W1-OTEL", traced) == {
        ("W1-OTEL", "traced", "us_per_step"): 90.0,
        ("W1-OTEL", "traced", "ratio_to_untraced"): 1.4,
    }


def rounds(values: list[float]) -> list[dict[tuple[str, str, str], float]]:
    return [{("W2", "StepExecutor.execute", "us_per_model_call"): v} for v in values]


def test_table_shows_medians_ratio_spread_and_flags(compare: ModuleType) -> None:
    units = {"us_per_model_call": "us"}
    # B slower in every round: firm.
    slower = compare.summarize(
        rounds([100, 110, 90, 100]), rounds([150, 160, 140, 150]), units, 0.1
    )
    assert len(slower) == 1
    row = slower[0]
    assert (row.a, row.b, row.n_a, row.n_b) == (100, 150, 4, 4)
    assert row.ratio == pytest.approx(1.5)
    assert row.flag == "SLOWER"
    table = compare.format_table(slower, 4).splitlines()
    assert table[0] == "| workload | variant | metric | A | B | B/A | spread | flag |"
    assert table[2].startswith(
        "| W2 | StepExecutor.execute | us_per_model_call | 100 us | 150 us | 1.500 | "
    )
    assert table[2].endswith(" | SLOWER |")
    # The medians differ but the rounds disagree: noise.
    noisy = compare.summarize(rounds([100, 100, 100, 100]), rounds([60, 70, 200, 300]), units, 0.1)
    assert noisy[0].ratio == pytest.approx(1.35)
    assert noisy[0].flag == "slower?"
    # Within the threshold: no flag; faster beyond it: FASTER.
    same = compare.summarize(rounds([100, 100, 100]), rounds([103, 98, 101]), units, 0.1)
    assert same[0].flag == ""
    faster = compare.summarize(rounds([100, 100, 100]), rounds([50, 55, 60]), units, 0.1)
    assert faster[0].flag == "FASTER"
    # Two rounds are too few to be sure.
    few = compare.summarize(rounds([100, 100]), rounds([150, 150]), units, 0.1)
    assert few[0].flag == "slower?"


def test_fewer_queries_a_second_is_better_and_fewer_runs_a_second_worse(
    compare: ModuleType,
) -> None:
    def load(metric: str, a: list[float], b: list[float]) -> str:
        key = ("IDLE", "postgres", metric)
        row = compare.summarize([{key: v} for v in a], [{key: v} for v in b], {}, 0.1)[0]
        flag: str = row.flag
        return flag

    # An idle worker's statements and the server's transactions: costs, though a second.
    assert load("queries_per_s", [40, 42, 41], [1, 0.9, 1.1]) == "FASTER"
    assert load("server_xacts_per_s", [2, 2, 2], [40, 41, 42]) == "SLOWER"
    assert load("store_queries_per_s", [2, 2, 2], [40, 41, 42]) == "SLOWER"
    # Throughputs: more is better.
    assert load("runs_per_s", [40, 42, 41], [20, 21, 19]) == "SLOWER"
    assert load("deltas_per_s", [20, 21, 19], [40, 42, 41]) == "FASTER"


def test_missing_rounds_and_non_positive_values(compare: ModuleType) -> None:
    key = ("W4", "ScriptedModel", "structured_overhead_us")
    a = [{key: 8.0}, {key: 9.0}, {}]  # A's third run failed
    b = [{key: -1.0}, {key: 2.0}, {key: -0.5}]  # a difference of timings within the noise
    row = compare.summarize(a, b, {"structured_overhead_us": "us"}, 0.1)[0]
    assert (row.n_a, row.n_b) == (2, 3)
    assert row.ratio is None
    assert row.flag == ""
    table = compare.format_table([row], 3).splitlines()
    assert table[2] == (
        "| W4 | ScriptedModel | structured_overhead_us | 8.5 us (n=2) | -0.5 us | - |  |  |"
    )
