"""The Grafana dashboard in deploy/grafana/: the fields Grafana's import reads (a datasource input
the panels use, a uid, panels with a type, a place and queries), every query valid PromQL to the
real promtool (as a recording rule), and every metric it reads one that something here writes:
SGLang's and smg's (captured texts under tests/data/traffic/), the watch's textfile, or Prometheus' own."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.core import autoswitch_apply as AP
from components.core import server_metrics as M
from components.core import traffic_status as T
from components.core import watch as W

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "gpu-serving.json"
TRAFFIC = ROOT / "tests" / "data" / "traffic"
PROMQL_FUNCTIONS = {"sum", "max", "rate", "increase", "histogram_quantile", "time"}


def metric_names(expr: str) -> set[str]:
    """The metrics a query reads: its words once label matchers, groupings and ranges are out."""
    bare = re.sub(r"\[[^\]]*\]", "", re.sub(r"\bby\s*\([^)]*\)", "", re.sub(r"\{[^}]*\}", "", expr)))
    return set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare)) - PROMQL_FUNCTIONS


def known_metrics() -> set[str]:
    names = {"up"}
    for text in (TRAFFIC / "sglang-tp8-all-schedulers-five-running.prom", TRAFFIC / "smg-1.13.0-five-in-flight.prom"):
        names |= {n for n, _, _ in M.samples(text.read_text())}
    doc = {"checked_at_seconds": 0, "check_errors_total": 0, "stacks": [{"stack": "tp8", "hosts": [
        {"host": "h", "drifted": [], "superseded": False, "serving_here": True, "ready": True, "error": None}]}]}
    prom = W.render_prometheus(doc) + T.render_prometheus({"groups": [{"stack": "tp8", "hosts": ["h"], "summary": {
        "concurrency": 1.0}, "recommendation": {"recommended": "pp8"}}]})
    names |= {n for n, _, _ in M.samples(prom)}
    section = {"apply": True, "groups": [{"stack": "pp8", "to": "tp8", "decision": {"checks": [
        {"name": "window", "ok": False, "detail": "outside"}]}}]}
    names |= {n for n, _, _ in M.samples(AP.render_prometheus(section, [
        {"at": 1.0, "applied": True, "switch": {"started": 1.0, "ok": True}}], now=2.0))}
    return names


def exprs(doc: dict) -> list[str]:
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def test_the_fields_grafanas_import_reads():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    inputs = {i["name"]: i for i in doc["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource" and inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    assert {r["id"] for r in doc["__requires"]} >= {"grafana", "prometheus"} | {p["type"] for p in doc["panels"]}
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        assert p["type"] and p["title"] and p["targets"], p
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"} and g["x"] + g["w"] <= 24, p["title"]
        for t in [p, *p["targets"]]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
    titles = " ".join(p["title"] for p in doc["panels"]).lower()
    for what in ("load", "first token", "inter-token", "strategy per host", "drift", "readiness"):
        assert what in titles, what


def test_every_query_is_promql_and_reads_a_metric_something_here_writes(tmp_path):
    doc = json.loads(DASHBOARD.read_text())
    known = known_metrics()
    for expr in exprs(doc):
        names = metric_names(expr)
        assert names and names <= known, (expr, names - known)
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed: run scripts/install-host-deps (Debian's prometheus package)", pytrace=False)
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": e}
                                                        for i, e in enumerate(exprs(doc))]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # The check can fail: a broken query is refused.
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (host (up)"}]}]}))
    assert subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60).returncode != 0
