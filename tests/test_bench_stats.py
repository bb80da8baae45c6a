"""The benchmark runner's pure parts (bench/stats.py, bench/hosts.py parsers, the CLI's
defaults) with data: no hosts, no timing assertions."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import downtime
from bench import hosts as H
from bench import stats
from bench.runner import parse_args, render


def sample(seconds, conns=1, sessions=3):
    return {"seconds": seconds, "connections": conns, "sessions": sessions}


SAMPLES = {
    "single": {
        "noop": {
            "gpu-serving": [sample(4.0, 2, 22), sample(3.0, 2, 22), sample(5.0, 2, 22)],
            "ansible": [sample(3.0, 1, 16), sample(3.2, 1, 16), sample(3.1, 1, 16)],
            "pyinfra": [sample(1.0, 1, 9), sample(1.0, 1, 9)],
            "raw-ssh": [sample(0.25, 1, 1), sample(0.2, 1, 1), sample(0.3, 1, 1)],
        },
    },
    "fleet": {"noop": {}},
}
SAMPLES["fleet"]["noop"] = {1: SAMPLES["single"]["noop"],
                            2: {"gpu-serving": [sample(6.0, 4)], "raw-ssh": [sample(0.5, 2)]}}


def test_summary_is_min_median_max():
    assert stats.summarize([3, 1, 2]) == {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3}
    assert stats.summarize([1, 2]) == {"min": 1.0, "median": 1.5, "max": 2.0, "n": 2}
    assert stats.summarize([]) is None
    s = stats.summarize_samples([sample(1.0, 1, 5), sample(2.0, 3, 7), sample(9.0, 1, 6)])
    assert s["seconds"]["median"] == 2.0 and s["connections"] == 1 and s["sessions"] == 6


def test_ratios_over_raw_and_ours_over_each_peer():
    summary = stats.summarize_results(SAMPLES)
    r = summary["ratios"]["noop"]
    assert r["over_raw"]["raw-ssh"] == pytest.approx(1.0)
    assert r["over_raw"]["gpu-serving"] == pytest.approx(4.0 / 0.25)
    assert r["ours_over"]["ansible"] == pytest.approx(4.0 / 3.1)
    assert r["ours_over"]["pyinfra"] == pytest.approx(4.0)
    assert "gpu-serving" not in r["ours_over"]


def test_fleet_scaling_is_relative_to_one_host():
    summary = stats.summarize_results(SAMPLES)
    scaling = summary["scaling"]["noop"]
    assert scaling["gpu-serving"]["1"] == pytest.approx(1.0)
    assert scaling["gpu-serving"]["2"] == pytest.approx(1.5)
    assert scaling["raw-ssh"]["2"] == pytest.approx(2.0)
    assert "2" not in scaling["ansible"]  # not measured at N=2: no ratio invented


def test_the_machines_cpu_seconds_are_summarized_and_shown_per_fleet_size():
    # What the machine worked during a run: the tool and its rehearsal hosts share its cores, so
    # CPU s over the core count is the least T(N) can be there (docs/benchmarks.md, tenth round).
    by_n = {1: {"gpu-serving": stats.summarize_samples([{**sample(4.0), "cpu": 5.0}, {**sample(5.0), "cpu": 7.0},
                                                         {**sample(4.5), "cpu": 6.0}])},
            4: {"gpu-serving": stats.summarize_samples([{**sample(9.0), "cpu": 15.5}]),
                "pyinfra": stats.summarize_samples([sample(3.0)])}}  # a run from before the figure
    assert by_n[1]["gpu-serving"]["cpu"] == 6.0
    assert by_n[4]["pyinfra"]["cpu"] is None
    text = stats.fleet_table("switch", by_n)
    assert "CPU s N=1" in text and "CPU s N=4" in text
    def cells(tool):
        line = next(line for line in text.splitlines() if line.startswith(f"| {tool} "))
        return [c.strip() for c in line.strip("|").split("|")]
    assert cells("gpu-serving")[-2:] == ["6.00", "15.50"]
    assert cells("pyinfra")[-2:] == ["-", "-"]


def test_ratio_of_missing_or_zero_is_none():
    assert stats.ratio(None, 1.0) is None and stats.ratio(1.0, 0) is None and stats.ratio(2.0, 4.0) == 0.5


def test_report_renders_every_table():
    results = {"started": "2026-01-01T00:00:00Z", "seconds": 60, "config": {"repeat": 3, "quick": False, "note": "t"},
               "machine": {"cpu": "cpu", "cores": 2, "memory": "1 GiB", "pulumi": "v3", "ansible-core": "a",
                           "pyinfra": "p", "openssh": "o", "commit": "c"},
               "summary": stats.summarize_results(SAMPLES)}
    results["summary"]["variants"] = {"noop: --skip-preview": stats.summarize_samples([sample(2.0)])}
    text = render(results)
    assert "no-op converge" in text and "fleet scaling" in text and "--skip-preview" in text
    row = next(line for line in text.splitlines() if line.startswith("| gpu-serving") and "16.00x" in line)
    assert "| 4.00 " in row  # the median, and its ratio over raw-ssh
    assert "T(2)/T(1)" in text


STATE = """\
file /etc/gpu-serving/kimi-k2.6.env {env} 600
file /etc/systemd/system/u-tp8.service {tp8} 644
file /etc/systemd/system/u-ep8.service {ep8} 644
file /etc/systemd/system/u-pp8.service absent -
unit u-tp8.service inactive disabled no
unit u-ep8.service active enabled no
unit u-pp8.service inactive - no
health 200
info tp_size:8 ep_size:8 pp_size:1
"""


def plans():
    base = {"environment_path": "/etc/gpu-serving/kimi-k2.6.env", "environment_text": "A=1\n", "port": 30001}
    return {s: {**base, "unit_name": f"u-{s}.service", "unit_text": f"[Unit] {s}\n",
                "layout": {"tp_size": 1 if s == "pp8" else 8, "pp_size": 8 if s == "pp8" else 1, "ep_size": 8 if s == "ep8" else 1}}
            for s in ("tp8", "ep8", "pp8")}


def test_state_check_accepts_the_declared_state():
    p = plans()
    text = STATE.format(env=H.sha256("A=1\n"), tp8=H.sha256(p["tp8"]["unit_text"]), ep8=H.sha256(p["ep8"]["unit_text"]))
    assert H.expected_problems(H.parse_state(text), p, "ep8") == []


def test_state_check_names_each_difference():
    p = plans()
    text = STATE.format(env=H.sha256("A=2\n"), tp8=H.sha256(p["tp8"]["unit_text"]), ep8=H.sha256("edited"))
    text = text.replace("kimi-k2.6.env " + H.sha256("A=2\n") + " 600", "kimi-k2.6.env " + H.sha256("A=2\n") + " 644")
    text = text.replace("unit u-ep8.service active enabled no", "unit u-ep8.service active disabled yes")
    text = text.replace("health 200", "health 503").replace("ep_size:8", "ep_size:1")
    text = text.replace("unit u-tp8.service inactive disabled no", "unit u-tp8.service active enabled no")
    problems = "\n".join(H.expected_problems(H.parse_state(text), p, "ep8"))
    for expected in ("not the rendered environment", "mode 644", "not the rendered ep8 unit", "not enabled",
                     "not reloaded", "answers 503", "ep_size=1", "u-tp8.service is active, expected inactive",
                     "u-tp8.service is enabled"):
        assert expected in problems


def test_sshd_log_counts_connections_and_sessions():
    lines = ["Accepted publickey for root from 10.213.1.1 port 5 ssh2: ED25519 SHA256:x",
             "Starting session: command for root from 10.213.1.1 port 5 id 0",
             "Starting session: subsystem 'sftp' for root from 10.213.1.1 port 5 id 1",
             "Received disconnect from 10.213.1.1 port 5:11: disconnected by user"]
    assert H.count(lines) == (1, 2)


def test_cli_defaults_and_quick_mode():
    full = parse_args([])
    assert full.repeat == 4 and full.fleet == [1, 2, 4] and full.tools == list(stats.TOOLS)
    quick = parse_args(["--quick"])
    assert quick.repeat == 2 and quick.fleet == [1, 2]
    assert parse_args(["--fleet", "4,2", "--repeat", "3"]).fleet == [1, 2, 4]
    with pytest.raises(SystemExit):
        parse_args(["--tools", "chef"])


def test_the_no_checkpoints_row_is_gpu_serving_with_the_state_written_once():
    from bench.tools import GpuServing, GpuServingNoCheckpoints
    from bench.workspace import Project
    assert parse_args(["--tools", "gpu-serving,gpu-serving-no-checkpoints"]).tools[1] == "gpu-serving-no-checkpoints"
    assert "gpu-serving-no-checkpoints" not in parse_args([]).tools  # a measurement: only when named
    one = {"h0": Project("h0", Path("/p/h0"), {"PULUMI_BACKEND_URL": "file:///s"})}
    fleet = {("h0", "h1"): Project("", Path("/p/fleet"), {"PULUMI_BACKEND_URL": "file:///f"})}
    tool = GpuServingNoCheckpoints(one, fleets=fleet)
    assert tool.projects["h0"].env == {"PULUMI_BACKEND_URL": "file:///s", "PULUMI_SKIP_CHECKPOINTS": "true"}
    assert tool.fleets[("h0", "h1")].env["PULUMI_SKIP_CHECKPOINTS"] == "true"
    assert "PULUMI_SKIP_CHECKPOINTS" not in one["h0"].env  # the shared projects are not changed
    assert tool.args("converge", "ep8") == GpuServing(one).args("converge", "ep8")  # the same command
    from bench.tools import GpuServingCold
    assert GpuServingCold(one, fleets=fleet).projects["h0"].env == {"PULUMI_BACKEND_URL": "file:///s",
                                                                    "GPU_SERVING_WARM_START": "0"}
    assert stats._order(["pyinfra", "gpu-serving-no-checkpoints", "gpu-serving"])[:2] == [
        "gpu-serving", "gpu-serving-no-checkpoints"]


ROUTER_SAMPLES = json.loads((Path(__file__).parent / "data" / "bench" / "router-samples.json").read_text())


def test_router_scenario_summary_and_table():
    summary = stats.summarize_results({"single": {}, "fleet": {}, "router": ROUTER_SAMPLES})["router"]
    rolling, at_once = summary["rolling"], summary["all_at_once"]
    assert rolling["seconds"] == {"min": 38.9, "median": 41.2, "max": 44.0, "n": 3}
    assert (rolling["served"], rolling["failed"], rolling["failed_each"], rolling["fewest_serving"]) == (310, 0, [0, 0, 0], 2)
    assert (at_once["served"], at_once["failed"], at_once["failed_each"], at_once["fewest_serving"]) == (60, 120, [120, 98, 131], 0)
    text = stats.report({"summary": {"router": summary}})
    assert "### fleet switch with router: tp8 -> ep8 on 3 hosts, 4 clients" in text
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in text.splitlines()
            if line.startswith("| with") or line.startswith("| no router")}
    assert rows["with router: rolling, 1 host at a time"] == ["41.2", "38.9-44.0", "3", "310", "0", "0, 0, 0", "2 of 3"]
    assert rows["no router: every host at once"] == ["14.5", "13.9-15.1", "3", "60", "120", "120, 98, 131", "0 of 3"]
    assert stats.router_summary(None) is None


def test_router_scenario_wiring_on_the_command_line():
    args = parse_args(["--scenarios", "router", "--fleet", "1,3", "--repeat", "1"])
    assert args.scenarios == ["router"] and max(args.fleet) == 3
    assert "router" in parse_args([]).scenarios  # a default run measures it too, on its largest fleet
    with pytest.raises(SystemExit):
        parse_args(["--scenarios", "router", "--fleet", "1"])  # a fleet of one has nothing to roll


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).parent / "data" / "bench-downtime").glob("*.json")))
def test_downtime_from_the_probes_and_the_hosts_journal(name):
    """bench/downtime.py: (a), (b), (c) of one switch from the prober's answers and the host's
    journal events (tests/data/bench-downtime/), with data only."""
    case = json.loads((Path(__file__).parent / "data" / "bench-downtime" / f"{name}.json").read_text())
    one = downtime.compute([tuple(p) for p in case["probes"]], case["events"], case["old_unit"], case["new_unit"])
    got = downtime.combine([one], case["returned"])
    assert {k: None if v is None else round(v, 3) for k, v in got.items()} == case["expect"]


def test_a_fleets_downtime_is_its_worst_host_and_its_last_first_generation():
    a = {"stop_to_start": 0.2, "first_ok": 10.0, "idle_sessions": 3, "idle_seconds": 9.0}
    b = {"stop_to_start": 0.4, "first_ok": 11.0, "idle_sessions": 2, "idle_seconds": 10.0}
    assert downtime.combine([a, b], 12.0) == {"stop_to_start": 0.4, "ready_to_return": 1.0, "idle_sessions": 3,
                                              "idle_seconds": 10.0}
    # A host without evidence makes the fleet's figure unknown, not the others' best.
    assert downtime.combine([a, {**b, "first_ok": None, "stop_to_start": None}], 12.0)["ready_to_return"] is None


def test_a_switch_whose_new_server_failed_and_restarted_says_so():
    # A run that took long (one 4-host run of 128 s, docs/benchmarks.md tenth round): systemd's
    # lines about the units under the run are kept with its downtime, so the outlier says why.
    events = [{"t": 10.0, "kind": "stop", "unit": "old"}, {"t": 10.1, "kind": "start", "unit": "new"},
              {"t": 11.0, "kind": "failure", "unit": "new", "message": "Main process exited, code=exited, status=1/FAILURE"},
              {"t": 11.0, "kind": "failure", "unit": "other", "message": "Failed with result 'exit-code'."},
              {"t": 41.0, "kind": "failure", "unit": "new", "message": "Scheduled restart job, restart counter is at 1."}]
    probes = [(9.9, True), (10.5, False), (42.0, True)]
    one = downtime.compute(probes, events, "old", "new")
    assert one["failures"] == ["Main process exited, code=exited, status=1/FAILURE",
                               "Scheduled restart job, restart counter is at 1."]
    assert one["idle_seconds"] == 32.0
    assert downtime.combine([one, {**one, "failures": []}], 43.0)["failures"] == one["failures"]
    assert "failures" not in downtime.combine([{**one, "failures": []}], 43.0)


def test_the_report_prints_the_downtime_rows():
    samples = {"single": {"switch": {"gpu-serving": [
        {**sample(5.0, 2, 20), "downtime": {"stop_to_start": 0.1, "ready_to_return": 1.4, "idle_sessions": 2, "idle_seconds": 0.5}},
        {**sample(6.0, 2, 20), "downtime": {"stop_to_start": 0.3, "ready_to_return": 1.6, "idle_sessions": 4, "idle_seconds": 0.7}}]}},
        "fleet": {}}
    results = {"summary": stats.summarize_results(samples), "config": {"load_seconds": 20}}
    text = stats.report(results)
    assert "switch downtime, from the host side (engine loads 20 s)" in text
    assert "| 1     | 2    | 5.50     | 0.20" in text and "| 1.50 " in text and "| 3 " in text


def test_the_accounting_table_has_medians_per_command_over_the_runs():
    def run(cpu, **by_command):
        return {**sample(2.0), "cpu": cpu, "accounted": {c: {"count": 1, "cpu": v} for c, v in by_command.items()}}

    samples = {"single": {"switch": {"gpu-serving": [run(1.0, pulumi=0.4, python=0.2), run(1.2, pulumi=0.6),
                                                     run(1.1, pulumi=0.5, python=0.3)],
                                     "pyinfra": [sample(1.0)]}},  # no accounting: no row
               "fleet": {"switch": {"1": {}, "4": {"gpu-serving": [run(4.0, pulumi=1.2, python3=0.4)]}}}}
    text = stats.accounted_table(samples, top=2)
    rows = [line for line in text.splitlines() if line.startswith("| switch")]
    # python: 0.2, none (0.0), 0.3 -> 0.2; accounted: 0.6, 0.6, 0.8 -> 0.6
    assert [c.strip() for c in rows[0].split("|")[1:-1]] == [
        "switch N=1 gpu-serving", "3", "1.10", "0.60", "pulumi 0.50, python 0.20"], rows
    assert "switch N=4 gpu-serving" in rows[1] and "pulumi 1.20, python3 0.40" in rows[1]
    assert len(rows) == 2
    assert stats.accounted_table({"single": {"noop": {"pyinfra": [sample(1.0)]}}}) == ""



def test_traced_switches_run_on_each_fleet_size_that_has_one_stack(monkeypatch):
    """bench/runner.py's traced switches, with the engine's run replaced by a recorded log: one
    list of split switches per fleet size that has one stack for its hosts, each from a reset."""
    from types import SimpleNamespace

    from bench import runner, trace
    from bench.tools import GpuServing
    from bench.workspace import Project
    log_text = (Path(__file__).parent / "data" / "bench" / "trace-up-switch-4-hosts.log").read_text()
    start = trace.events(log_text.splitlines())[0][0]
    hosts = [SimpleNamespace(name=f"h{i}") for i in range(4)]
    single = {h.name: Project(h.name, Path(f"/p/{h.name}"), {}) for h in hosts}
    four = Project("", Path("/p/fleet4"), {})
    bench = runner.Bench.__new__(runner.Bench)
    bench.args = SimpleNamespace(split=2, fleet=[1, 2, 4])
    bench.hosts, bench.plans, bench.flakes, bench.split_switch = hosts, {}, [], {}
    bench.tools = [GpuServing(single, fleets={tuple(h.name for h in hosts): four})]  # no stack for 2 hosts
    calls, resets = [], []
    monkeypatch.setattr(bench, "reset", lambda group: resets.append(len(group)), raising=False)
    monkeypatch.setattr(bench, "verify", lambda *a: None, raising=False)
    monkeypatch.setattr(runner.tools, "traced", lambda project, args: (calls.append((project.dir.name, args)) or
                                                                       (start - 0.1, start + 4.0, log_text)))
    bench.run_split_switch()
    assert sorted(bench.split_switch) == [1, 4] and all(len(v) == 2 for v in bench.split_switch.values())
    assert resets == [1, 1, 4, 4]  # tp8 serving again before each traced switch
    assert [c[0] for c in calls] == ["h0", "h0", "fleet4", "fleet4"]
    assert calls[0][1] == ["up", "--stack", "ep8", "--yes"]
    assert bench.split_switch[4][0]["hosts"] == 4 and bench.split_switch[4][0]["service"] > 1.9


class _Journal:
    """A rehearsal host whose `sh` answers with a fixed journal text and keeps the command."""

    def __init__(self, text: str):
        self.text, self.commands = text, []

    def sh(self, command, timeout=120, check=True):
        self.commands.append(command)
        return self.text


def test_a_run_lost_to_the_rehearsal_cgroup_race_is_told_apart():
    from bench import hosts as H
    units = ["sglang-kimi-k2.6-tp8.service", "sglang-kimi-k2.6-ep8.service"]
    failed_start = _Journal("sglang-kimi-k2.6-ep8.service: Main process exited, code=exited, status=219/CGROUP\n")
    assert H.cgroup_flake(failed_start, units, 1000.0)
    assert "--since @999" in failed_start.commands[0] and all(f"-u {u}" in failed_start.commands[0] for u in units)
    # the old server's stop could not be signalled: the switch waited out TimeoutStopSec
    stuck_stop = _Journal("sglang-kimi-k2.6-tp8.service: Failed to kill control group "
                          "/system.slice/sglang-kimi-k2.6-tp8.service, ignoring: Input/output error\nStopping ...\n")
    assert H.cgroup_flake(stuck_stop, units, 1000.0)
    assert not H.cgroup_flake(_Journal("Stopping ...\nStopped ...\nStarted ...\n"), units, 1000.0)


def test_a_traced_switch_lost_to_the_cgroup_race_is_run_again_while_attempts_are_left(monkeypatch):
    """bench/runner.py: timed and traced runs share one rule: a failure with the race in a host's
    journal is run again, up to CGROUP_TRIES attempts in all; any other failure is raised."""
    from bench import runner
    from bench.tools import GpuServing, ToolFailed
    from bench.workspace import Project
    bench = runner.Bench.__new__(runner.Bench)
    bench.plans = {"tp8": {"unit_name": "a.service"}, "ep8": {"unit_name": "b.service"}}
    bench.flakes = []
    monkeypatch.setattr(bench, "reset", lambda group: None, raising=False)
    raced = [_Journal("b.service: Main process exited, code=exited, status=219/CGROUP\n")]
    assert bench._lost_to_cgroup_race(raced, 1000.0, 0)
    assert all("-u a.service" in c and "-u b.service" in c for c in raced[0].commands)
    assert not bench._lost_to_cgroup_race(raced, 1000.0, runner.CGROUP_TRIES - 1)  # no attempt left
    assert not bench._lost_to_cgroup_race([_Journal("Started ...\n")], 1000.0, 0)

    def always_fails(project, args):
        raise ToolFailed("pulumi up failed")

    monkeypatch.setattr(runner.tools, "traced", always_fails)
    gs = GpuServing({"h0": Project("h0", Path("/p/h0"), {})})
    with pytest.raises(ToolFailed):
        bench._traced_switch(gs, gs.projects["h0"], raced)
    assert bench.flakes == ["traced switch N=1"] * (runner.CGROUP_TRIES - 1)
    bench.flakes = []
    with pytest.raises(ToolFailed):  # not the race: raised at once
        bench._traced_switch(gs, gs.projects["h0"], [_Journal("Started ...\n")])
    assert bench.flakes == []


def test_a_timed_run_lost_to_the_cgroup_race_is_set_up_and_run_again(monkeypatch):
    """bench/runner.py measure(): a no-op run that failed with the race in a host's journal is
    counted as a flake, its unit served again, and run again; the second run is the sample."""
    from types import SimpleNamespace

    from bench import runner
    from bench.tools import ToolFailed
    bench = runner.Bench.__new__(runner.Bench)
    bench.args = SimpleNamespace(account=False, cpu_split=False)
    bench.plans = {"tp8": {"unit_name": "a.service", "port": 30001}, "ep8": {"unit_name": "b.service", "port": 30002}}
    bench.flakes = []
    served = []
    monkeypatch.setattr(bench, "reset", lambda group: served.append("reset"), raising=False)
    monkeypatch.setattr(bench, "verify", lambda *a: None, raising=False)
    monkeypatch.setattr(runner.H, "Counter", lambda hosts: SimpleNamespace(start=lambda: None, stop=lambda: (1, 7)))
    monkeypatch.setattr(runner.H, "serve", lambda h, unit, port, units: served.append((unit, port, tuple(units))))
    journal = _Journal("b.service: Main process exited, code=exited, status=219/CGROUP\n")

    class Tool:
        name, runs = "gpu-serving", 0

        def converge(self, stack, hosts):
            self.runs += 1
            if self.runs == 1:  # the race is in the journal for this run
                raise ToolFailed("pulumi up failed")
            journal.text = "Started ...\n"

        def after_run(self):
            pass

    tool = Tool()
    sample = bench.measure(tool, "converge", "ep8", [journal], "noop")
    assert tool.runs == 2 and bench.flakes == ["noop N=1 gpu-serving"]
    assert served == ["reset", ("b.service", 30002, ("a.service", "b.service"))]
    assert sample["connections"] == 1 and sample["sessions"] == 7
