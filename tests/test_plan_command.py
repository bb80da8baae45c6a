"""`python -m components plan` as a user runs it: real subprocess, real stack files."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_plan(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "components", "plan", *args], cwd=cwd,
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("stack,tp,pp,ep", [("tp8", 8, 1, 1), ("pp8", 1, 8, 1), ("ep8", 8, 1, 8)])
def test_plan_json_for_shipped_stacks(stack, tp, pp, ep):
    out = run_plan("--stack", stack, "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["world_size"] == 8
    assert (plan["layout"]["tp_size"], plan["layout"]["pp_size"], plan["layout"]["ep_size"]) == (tp, pp, ep)
    assert plan["unit_name"] == f"sglang-kimi-k2.6-{stack}.service"
    assert isinstance(plan["exec_start"], list) and all(isinstance(a, str) for a in plan["exec_start"])
    assert plan["exec_start"][plan["exec_start"].index("--tp-size") + 1] == str(tp)
    assert plan["environment"]["NCCL_ALGO"] == "Ring"
    assert set(plan["memory"]) >= {"weights_gb", "kv_pool_gb", "max_total_tokens", "kv_bytes_per_token", "stages"}


def test_plan_text_output():
    out = run_plan("--stack", "pp8")
    assert out.returncode == 0, out.stderr
    assert "world size 8 of 8 GPUs" in out.stdout
    assert "stage 7: 8 layers" in out.stdout
    assert "ExecStart=" in out.stdout


def write_project(tmp_path, stack_yaml):
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.bad.yaml").write_text(stack_yaml)


def test_invalid_stack_fails_with_named_setting_and_no_traceback(tmp_path):
    write_project(tmp_path, "config:\n  gpu-serving:strategy:\n    tpSize: 1\n    epSize: 8\n")
    out = run_plan("--stack", "bad", "--project-dir", str(tmp_path))
    assert out.returncode == 2
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    assert "gpu-serving:strategy" in out.stderr
    assert "EP subdivides the TP group; for EP8 on 8 GPUs use tpSize 8, epSize 8" in out.stderr


def test_invalid_yaml_is_a_clear_error(tmp_path):
    write_project(tmp_path, "config: [unclosed\n")
    out = run_plan("--stack", "bad", "--project-dir", str(tmp_path))
    assert out.returncode == 2 and "Pulumi.bad.yaml" in out.stderr and "Traceback" not in out.stderr


def test_unknown_stack_lists_known_ones():
    out = run_plan("--stack", "nope")
    assert out.returncode == 2 and "known stacks: ep8, pd1p1d, pp8, tp16x2, tp8, tp8x2" in out.stderr


def test_switch_diff_shows_the_changed_flags_only():
    out = run_plan("--stack", "ep8", "--against", "tp8")
    assert out.returncode == 0, out.stderr
    assert "sglang-kimi-k2.6-tp8.service stops, sglang-kimi-k2.6-ep8.service starts" in out.stdout
    assert "-    --ep-size 1 \\" in out.stdout and "+    --ep-size 8 \\" in out.stdout
    assert "--tp-size" not in out.stdout  # unchanged lines outside the context are not shown
    assert "environment: identical" in out.stdout


FLEET_STACK = """config:
  gpu-serving:strategy: {tpSize: 8, epSize: 8}
  gpu-serving:hosts:
    - {name: gpu1, address: 10.0.0.11}
    - {name: gpu2, address: 10.0.0.12}
    - {name: big, rehearsal: h200, gpuMemoryGb: 141}
"""


def write_fleet(tmp_path):
    write_project(tmp_path, "config: {}\n")
    (tmp_path / "Pulumi.fleet.yaml").write_text(FLEET_STACK)


def test_plan_of_a_fleet_prints_each_kind_of_host_once(tmp_path):
    write_fleet(tmp_path)
    out = run_plan("--stack", "fleet", "--project-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("stack fleet: 3 hosts")
    # Two 96 GB hosts share one plan; the 141 GB host has a bigger KV pool, shown apart.
    assert "=== gpu1 (10.0.0.11:22), gpu2 (10.0.0.12:22)" in out.stdout
    assert "=== big (rehearsal:h200)" in out.stdout
    assert out.stdout.count("KV capacity") == 2
    js = json.loads(run_plan("--stack", "fleet", "--project-dir", str(tmp_path), "--json").stdout)
    assert [h["name"] for h in js["hosts"]] == ["gpu1", "gpu2", "big"]
    assert js["hosts"][2]["memory"]["max_total_tokens"] > js["hosts"][0]["memory"]["max_total_tokens"]


def test_rehearsal_hosts_lists_the_hosts_to_boot(tmp_path):
    write_fleet(tmp_path)
    cmd = [sys.executable, "-m", "components", "rehearsal-hosts", "--project-dir", str(tmp_path)]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd + ["--stack", "fleet"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.split() == ["h200"], out
    shipped = subprocess.run(cmd[:-2] + ["--stack", "ep8"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert shipped.stdout.split() == ["default"], shipped
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  gpu-serving:hosts: []\n")
    bad = subprocess.run(cmd + ["--stack", "bad"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "gpu-serving:hosts" in bad.stderr


def test_switch_as_json_is_json():
    """README: `python -m components plan --against tp8 --stack ep8 --json` prints JSON."""
    out = run_plan("--against", "tp8", "--stack", "ep8", "--json")
    assert out.returncode == 0, out.stderr
    switch = json.loads(out.stdout)
    assert (switch["from"], switch["to"]) == ("tp8", "ep8")
    assert (switch["stops"], switch["starts"]) == ("sglang-kimi-k2.6-tp8.service", "sglang-kimi-k2.6-ep8.service")
    assert "-    --ep-size 1 \\" in switch["unit_diff"] and "+    --ep-size 8 \\" in switch["unit_diff"]
    assert switch["environment_diff"] == []


MULTI_NODE = """config:
  gpu-serving:hosts:
    - name: a
      {first}
    - name: b
      rehearsal: plan-test-b
  gpu-serving:strategy:
    tpSize: 16
    nodes: [a, b]
"""


def test_multi_node_plan_names_where_the_ranks_meet(tmp_path):
    """Rank 0's real address when the stack gives it; a rehearsal rank 0 that is not running has
    none yet, and the plan says that the name it shows stands in for it."""
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    write_project(tmp_path, MULTI_NODE.format(first=f"address: 192.0.2.10\n      hostKey: {key}"))
    out = run_plan("--stack", "bad", "--project-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "rank 1 of 2 (a, b); the ranks meet at rank 0, 192.0.2.10:20000\n" in out.stdout
    assert "--dist-init-addr 192.0.2.10:20000" in out.stdout and "stands in" not in out.stdout

    write_project(tmp_path, MULTI_NODE.format(first="rehearsal: plan-test-a"))
    out = run_plan("--stack", "bad", "--project-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "the ranks meet at rank 0, rehearsal-plan-test-a:20000\n" in out.stdout
    assert "(rehearsal-plan-test-a stands in: the rehearsal host is not running" in out.stdout


def run_status(*args):
    return subprocess.run([sys.executable, "-m", "components", "status", *args], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_status_of_a_rehearsal_host_that_is_not_booted_is_nothing_serves(tmp_path):
    """A stack whose rehearsal hosts are not booted (never deployed, or torn down) serves nothing
    there: status says so and exits 0; a real host it cannot read still makes it exit 2."""
    write_project(tmp_path, MULTI_NODE.format(first="rehearsal: status-test-a"))
    out = run_status("--project-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["unreachable"] == [] and doc["down"] == ["rehearsal:status-test-a", "rehearsal:plan-test-b"], doc
    first = doc["hosts"][0]
    assert "'status-test-a' is not running, so nothing serves there" in first["down"]
    assert first["serving"] is None and first["stacks"][0]["state"] == "not on this host"
    text = run_status("--project-dir", str(tmp_path)).stdout
    assert "  down      the rehearsal host 'status-test-a' is not running" in text and "not read" not in text, text
    # As a probe of that stack (issue 36.14): nothing serves where it should, exit 3.
    out = run_status("--project-dir", str(tmp_path), "--stack", "bad")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "nothing serves on rehearsal:status-test-a, rehearsal:plan-test-b" in out.stdout, out.stdout

    # A real host without a pinned host key cannot be read: that is still exit 2, and named.
    write_project(tmp_path, MULTI_NODE.format(first="address: 192.0.2.10"))
    out = run_status("--project-dir", str(tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "not read: 192.0.2.10:22;" in out.stdout and "not booted (nothing serves there): rehearsal:plan-test-b" \
        in out.stdout, out.stdout


ROUTED_PROJECT = """
  gpu-serving:hosts:
    value:
      - {name: gpu1, address: 192.0.2.11, hostKey: KEY}
      - {name: gpu2, address: 192.0.2.12, hostKey: KEY}
  gpu-serving:router:
    value: {runsOn: gpu1}
"""


def test_a_router_in_pulumi_yaml_is_turned_off_by_a_multi_node_stack_named_in_the_error(tmp_path):
    """Issue 36.10: a router declared for the project's fleets in Pulumi.yaml could not be turned off
    for a multi-node stack, and the refusal said "remove gpu-serving:router from this stack" (it is
    not in that file) after a runsOn error about the fleet the router was not meant for. The
    refusal names the stack's file and the setting that turns it off; `false` does, read the same
    way from the files (plan) and from the engine (preview, up)."""
    from components.core.plan import check_stack
    from components.core.stack_config import from_engine, from_files

    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text() + ROUTED_PROJECT.replace("KEY", key))
    (tmp_path / "Pulumi.tp8.yaml").write_text((ROOT / "Pulumi.tp8.yaml").read_text())
    multi = (ROOT / "Pulumi.tp16x2.yaml").read_text()
    (tmp_path / "Pulumi.tp16x2.yaml").write_text(multi)
    out = run_plan("--stack", "tp16x2", "--project-dir", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert ("gpu-serving:router: a router fronts a fleet of independent servers; a multi-node layout is one server"
            in out.stderr), out.stderr
    assert "`gpu-serving:router: false` in Pulumi.tp16x2.yaml" in out.stderr
    assert "runsOn" not in out.stderr and "remove gpu-serving:router from this stack" not in out.stderr

    (tmp_path / "Pulumi.tp16x2.yaml").write_text(multi + "  gpu-serving:router: false\n")
    out = run_plan("--stack", "tp16x2", "--project-dir", str(tmp_path))
    assert out.returncode == 0 and out.stdout.startswith("stack tp16x2: 2 hosts"), out.stderr
    for stack, routed in (("tp16x2", False), ("tp8", True)):
        files = from_files(tmp_path, stack)
        engine = from_engine({k: json.dumps(v) for k, v in files.values.items()}, set())
        for raw in (files, engine):
            assert (check_stack(stack, raw, tmp_path).settings.router is not None) is routed, (stack, raw)
