"""The drift watch's pure part (components/core/watch.py): ticks in, states, change lines and the
files out. Cases in tests/data/watch/: each a run of ticks (what the previews and the status read
found) and what every tick must say. The Prometheus text of each case's last tick is a golden
file beside it (UPDATE_GOLDEN=1 rewrites it)."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from components.__main__ import main
from components.core import watch as W
from components.core.errors import ConfigError
from tests.casedata import DATA, cases, update_golden

CASES = cases("watch")


def run_ticks(case: dict) -> list[tuple[dict, list[dict]]]:
    before, out = None, []
    for i, t in enumerate(case["ticks"]):
        doc = W.tick_document(t["results"], t["status"], checked_at=f"2026-12-01T04:{i:02d}:00+00:00",
                              checked_at_seconds=1796097600.0 + 60 * i,
                              errors_before=(before or {}).get("check_errors_total", 0))
        found = W.changes(before, doc)
        out.append((doc, found))
        before = json.loads(json.dumps(doc))  # as status.json stores it
    return out


def by_stack(doc: dict) -> dict[str, dict]:
    return {s["stack"]: s["hosts"][0] for s in doc["stacks"]}


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_each_tick_says_what_the_case_expects(name, case):
    for i, ((doc, found), t) in enumerate(zip(run_ticks(case), case["ticks"])):
        entries = by_stack(doc)
        assert {s: e["state"] for s, e in entries.items()} == t["states"], i
        for stack, lines in t.get("drifted", {}).items():
            assert [item["lines"] for item in entries[stack]["drifted"]] == lines, (i, stack)
        assert [c["line"] for c in found] == t["lines"], i
        if "errors_total" in t:
            assert doc["check_errors_total"] == t["errors_total"], i
        text = json.dumps(doc) + json.dumps(found) + W.render_prometheus(doc)
        for never in t.get("never", []):
            assert never not in text, (i, never)


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_the_prometheus_text(name, case):
    doc, _ = run_ticks(case)[-1]
    text = W.render_prometheus(doc)
    path = DATA / "watch" / f"{name}.prom"
    if update_golden():
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text()
    # Every sample line: a metric name, labels, a number (the format node_exporter's textfile collector reads).
    for line in text.splitlines():
        if not line.startswith("#"):
            assert re.fullmatch(r'gpu_serving_[a-z_]+(\{stack="[^"]*",host="[^"]*"\})? -?[0-9.]+', line), line


def test_a_switch_is_never_counted_as_drift():
    doc, found = run_ticks(dict(CASES)["switch-then-environment-edit"])[1]
    tp8 = by_stack(doc)["tp8"]
    assert tp8["drifted"] == [] and [i["resource"] for i in tp8["switched"]] == ["service"]
    assert {c["kind"] for c in found} == {"switched"}
    assert 'gpu_serving_drifted_resources{stack="tp8",host="10.213.3.2"} 0' in W.render_prometheus(doc)


def test_the_webhook_payload_carries_the_changes_and_a_summary():
    doc, found = run_ticks(dict(CASES)["edit-then-repaired"])[1]
    payload = W.webhook_payload(doc, found)
    assert payload["changes"] == found and payload["checked_at"] == doc["checked_at"]
    assert {"stack": "tp8", "host": "10.213.3.2", "state": "drifted", "drifted": 1} in payload["status"]


def test_a_fleet_resource_belongs_to_the_host_of_its_entry():
    hosts = [("gpu1", "10.0.0.1"), ("gpu10", "10.0.0.10")]
    assert W.host_of("gpu1-unit-file", hosts) == "10.0.0.1"
    assert W.host_of("gpu10-unit-file", hosts) == "10.0.0.10"
    assert W.host_of("gpu10", hosts) == "10.0.0.10"
    assert W.host_of("unit-file", hosts) is None
    assert W.host_of("unit-file", [("", "10.0.0.1")]) == "10.0.0.1"


@pytest.mark.parametrize("text,seconds", [("10m", 600), ("30s", 30), ("1h", 3600), ("90", 90), (" 2 m", 120)])
def test_every(text, seconds):
    assert W.parse_every(text) == seconds


@pytest.mark.parametrize("text", ["", "0m", "5s", "ten minutes", "10x", "-1m", "10m\n", "１０m"])
def test_a_bad_every_names_the_option_and_a_valid_one(text):
    with pytest.raises(ConfigError) as info:
        W.parse_every(text)
    assert "--every" in str(info.value) and "--every 10m" in str(info.value)


def test_stacks_must_be_stacks_of_the_project_once_each():
    assert W.parse_stacks("tp8, ep8", ["ep8", "pp8", "tp8"]) == ["tp8", "ep8"]
    for bad, words, valid in ((",", "names no stack", "--stacks ep8,pp8,tp8"),
                              ("tp8,tp9", "'tp9' has no Pulumi.tp9.yaml", "one of: ep8, pp8, tp8"),
                              ("tp8,tp8", "names a stack twice", "(--stacks tp8)")):
        with pytest.raises(ConfigError) as info:
            W.parse_stacks(bad, ["ep8", "pp8", "tp8"])
        assert "--stacks" in str(info.value) and words in str(info.value) and valid in str(info.value), bad


def test_bad_options_are_refused_before_any_host_or_engine(tmp_path, capsys):
    project = Path(__file__).resolve().parents[1]
    state = tmp_path / "state"
    for argv, words in ((["--stacks", "tp9"], "tp9"), (["--stacks", "tp8", "--every", "1s"], "--every"),
                        (["--stacks", "tp8", "--webhook", "ftp://x"], "--webhook")):
        assert main(["watch", "--project-dir", str(project), "--state-dir", str(state), "--once", *argv]) == 2
        assert words in capsys.readouterr().err
    assert not state.exists()


def test_the_systemd_pair_runs_a_tick_the_cli_accepts(tmp_path):
    project = Path(__file__).resolve().parents[1]
    units = tmp_path / "units"
    assert main(["watch", "--project-dir", str(project), "--stacks", "tp8,pp8,ep8", "--every", "10m",
                 "--state-dir", "/var/lib/gpu-serving-watch", "--webhook", "http://127.0.0.1:9/hook",
                 "--env-file", "/etc/gpu-serving/watch.env", "--systemd-units", str(units)]) == 0
    service = (units / "gpu-serving-watch.service").read_text()
    timer = (units / "gpu-serving-watch.timer").read_text()
    assert f"WorkingDirectory={project}" in service and "EnvironmentFile=-/etc/gpu-serving/watch.env" in service
    assert "OnUnitActiveSec=600s" in timer and "WantedBy=timers.target" in timer
    # The service's command is the CLI's own: its options parse (here writing units again, no tick).
    command = re.search(r"exec python -m components (.*)'$", service, re.M).group(1).split()
    assert command[:2] == ["watch", "--once"] and "--webhook" in command
    assert main([*command, "--project-dir", str(project), "--env-file", "/etc/gpu-serving/watch.env",
                 "--systemd-units", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "gpu-serving-watch.service").read_text() == service
    # systemd's own reading of the pair (a bad key or section would be named here).
    done = subprocess.run(["systemd-analyze", "verify", str(units / "gpu-serving-watch.timer"),
                           str(units / "gpu-serving-watch.service")], capture_output=True, text=True, timeout=60)
    bad = [ln for ln in done.stderr.splitlines() if "gpu-serving-watch" in ln]
    assert bad == [], done.stderr


def test_the_shipped_pair_is_the_rendered_one():
    """deploy/watch/: the pair for a checkout in /opt/gpu-serving, as docs/teams-and-watch.md installs it;
    UPDATE_GOLDEN=1 writes it again after a change of render_systemd."""
    files = W.render_systemd(checkout="/opt/gpu-serving", stacks=["tp8", "pp8", "ep8"], every_seconds=600,
                             state_dir="/var/lib/gpu-serving-watch", env_file="/etc/gpu-serving/watch.env")
    shipped = Path(__file__).resolve().parents[1] / "deploy" / "watch"
    for name, text in files.items():
        if update_golden():
            shipped.mkdir(parents=True, exist_ok=True)
            (shipped / name).write_text(text)
        assert (shipped / name).read_text() == text, name


def test_the_documented_edit_line_is_what_the_watch_says_for_the_projects_ep8_unit():
    """The watch's "edited" line docs/teams-and-watch.md shows is the one it prints for the project's ep8 unit."""
    from components.core.plan import check_stack
    from components.core.stack_config import from_files
    project = Path(__file__).resolve().parents[1]
    plan = check_stack("ep8", from_files(project, "ep8"), project).plans[0][1]
    edited = plan.unit.text.replace("--max-running-requests 64 ", "--max-running-requests 128 ")
    item = W.resource_drift({"name": "unit-file", "type": "pulumi-python:dynamic/gpu-serving:RemoteFile", "op": "update",
                             "old": {"path": f"/etc/systemd/system/{plan.unit.name}", "content": edited},
                             "new": {"path": f"/etc/systemd/system/{plan.unit.name}", "content": plan.unit.text}})
    line = f"watch: edited: stack ep8 on 10.0.0.5: {W.describe(item)}"
    assert line in (project / "docs" / "teams-and-watch.md").read_text()


def test_a_host_out_of_the_router_is_a_gauge_of_its_own():
    doc, found = run_ticks(dict(CASES)["host-left-out-of-the-router"])[1]
    text = W.render_prometheus(doc)
    assert 'gpu_serving_in_router{stack="tp8",host="10.0.0.1:22"} 0' in text
    assert 'gpu_serving_in_router{stack="tp8",host="10.0.0.2:22"} 1' in text
    assert [c["kind"] for c in found] == ["router"]
    # A stack without a router has no such sample.
    alone, _ = run_ticks(dict(CASES)["edit-then-repaired"])[-1]
    assert "gpu_serving_in_router{" not in W.render_prometheus(alone)


def test_a_readiness_nobody_read_is_unknown_never_none():
    before = run_ticks(dict(CASES)["first-tick-records-then-one-alert-per-file"])[1][0]
    now = json.loads(json.dumps(before))
    entry = next(h for s in now["stacks"] if s["stack"] == "ep8" for h in s["hosts"])
    entry["readiness"] = None
    lines = [c["line"] for c in W.changes(before, now)]
    assert lines == ["readiness: stack ep8 on 10.213.3.2: ready -> unknown"], lines


def test_fitness_drift_is_its_own_kind_never_an_edit():
    doc, found = run_ticks(dict(CASES)["fitness-drift-then-restored"])[1]
    tp8 = by_stack(doc)["tp8"]
    assert tp8["state"] == "fitness drift" and tp8["drifted"] == [] and tp8["fitness_drift"][0].startswith("fitness drift: gpu1")
    assert [c["kind"] for c in found] == ["fitness"]
    text = W.render_prometheus(doc)
    assert 'gpu_serving_fitness_drift{stack="tp8",host="10.213.3.2"} 1' in text
    assert 'gpu_serving_drifted_resources{stack="tp8",host="10.213.3.2"} 0' in text
    status = {s["stack"]: s for s in W.webhook_payload(doc, found)["status"]}
    assert status["tp8"]["state"] == "fitness drift" and status["tp8"]["fitness_drift"] == tp8["fitness_drift"]
