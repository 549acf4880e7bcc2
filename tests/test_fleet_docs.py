"""The example Prometheus alert rules and Grafana dashboard of docs/operations/ load (YAML,
JSON) and name only metrics that exist: every name in their PromQL is one that a process
with minions' metrics and the store's gauges exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from minions._messages import Usage
from minions._tracing.prometheus import PrometheusMetrics
from minions.runs import EndpointLoad, FleetState, ScheduleState
from minions.service._routes.metrics import fleet_families
from minions.testing import ScriptedModel

DOCS = Path(__file__).parent.parent / "docs" / "operations"
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and",
                      "or", "unless", "bool", "offset"})  # fmt: skip


def exposed() -> set[str]:
    """Every metric and sample name a scrape of a serve with a worker can show."""
    exported = PrometheusMetrics()
    recorded = exported.metrics
    recorded.run_ended("r", "completed", duration=2.0, waited=1.0)
    with recorded.run("r"):
        recorded.step_ended("s", duration=1.0, waited=0.5)
    meter = recorded.model(ScriptedModel(["x"]))
    meter.started()
    meter.waiting()
    meter.waited()
    meter.retried("rate_limited")
    meter.failed(0.1, TimeoutError(), Usage(calls=1, prompt_tokens=3, completion_tokens=2))
    state = FleetState(
        at=100.0,
        schedules=(ScheduleState(name="nightly", next_at=50.0, late=True, late_slots=2),),
        endpoints=(
            EndpointLoad(
                endpoint="http://e/v1", in_flight=1, waiting=0, requests=1, tokens=1,
                paused_until=0.0,
            ),
        ),
    )  # fmt: skip
    text = exported.exposition(fleet_families(state)).decode()
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names of a PromQL expression."""
    text = re.sub(r'"[^"]*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", text)
    found = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in KEYWORDS:
            continue  # a function
        found.add(match.group())
    return found


def test_the_alert_rules_load_and_name_only_metrics_that_exist() -> None:
    rules = yaml.safe_load((DOCS / "alerts.yaml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert len(exprs) >= 8
    names = exposed()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert set(rule) >= {"alert", "expr", "labels", "annotations"}
            unknown = metric_names(rule["expr"]) - names
            assert not unknown, f"{rule['alert']} names {unknown}"


def test_the_dashboard_loads_and_names_only_metrics_that_exist() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    names = exposed()
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        unknown = metric_names(expr) - names
        assert not unknown, f"{expr!r} names {unknown}"


def test_the_names_check_would_catch_a_misspelt_metric() -> None:
    assert metric_names('sum by (recipe) (rate(minions_runs_totl{status="x"}[5m])) > 0.1') == {
        "minions_runs_totl"
    }
    assert "minions_runs_totl" not in exposed()
