"""What serves on a host (components/core/status.py), from the host's answer: data cases in
tests/data/status/ (the raw answer of SERVING_SCRIPT and what it must say)."""
from __future__ import annotations

import pytest

from components.core import status as S
from components.core.readiness import SYSTEMD_VARIABLES
from components.core import reads
from tests.casedata import cases

HOST_CASES = [(n, c) for n, c in cases("status") if "superseded" in c]
SWITCH_CASES = [(n, c) for n, c in cases("status") if "lines" in c]


@pytest.mark.parametrize("name,case", HOST_CASES, ids=[n for n, _ in HOST_CASES])
def test_what_serves_and_who_is_superseded(name, case):
    host = S.parse_serving(case["stdout"])
    for unit, expected in case["superseded"].items():
        assert S.superseded_by(unit, host) == expected, unit
    got = [{"unit": u.name, "stack": u.stack, "uptime_seconds": u.uptime_seconds, "layout": u.layout}
           for u in host.serving]
    assert got == case["serving"]


@pytest.mark.parametrize("name,case", SWITCH_CASES, ids=[n for n, _ in SWITCH_CASES])
def test_the_switch_block(name, case):
    host = S.parse_serving(case["stdout"])
    lines = S.switch_block(label="switch", target_unit=case["target_unit"], target_stack=case["target_stack"],
                           declared_argv=case["declared_argv"], declared_environment=case["declared_environment"],
                           secret_keys=case["secret_keys"], host=host, ignore_variables=SYSTEMD_VARIABLES)
    assert lines == case["lines"]
    text = "\n".join(lines)
    # No value of the running server's environment that the new declaration does not set.
    for key, value in host.units[0].environ.items():
        if key not in case["declared_environment"] and len(value) > 3:
            assert value not in text, key


def test_the_switch_block_is_empty_when_the_target_serves_alone():
    host = S.parse_serving(dict(cases("status"))["ep8-serves-tp8-superseded"]["stdout"])
    assert S.switch_block(label="switch", target_unit="sglang-kimi-k2.6-ep8.service", target_stack="ep8",
                          declared_argv=[], declared_environment={}, secret_keys=[], host=host) == []


def test_a_long_block_is_cut_with_the_command_that_shows_it_all():
    case = dict(cases("status"))["switch-tp8-to-ep8"]
    lines = S.switch_block(label="switch", target_unit="u.service", target_stack="ep8",
                           declared_argv=[f"--flag-{i}" for i in range(60)], declared_environment={}, secret_keys=[],
                           host=S.parse_serving(case["stdout"]), max_lines=40)
    assert len(lines) == 40 and "python -m components plan --stack ep8 --against tp8" in lines[-1]


def test_the_read_asks_for_environments_only_when_told():
    assert reads.serving()["argv"][-1] == "-" and reads.serving(with_environ=True)["argv"][-1] == "environ"
    assert "Environ=" in S.SERVING_SCRIPT and 'if [ "$1" = environ ]' in S.SERVING_SCRIPT


def test_file_drift_never_shows_values_of_a_file_that_may_hold_secrets():
    assert S.file_drift("A=1\n", "A=1\n") is None
    assert S.file_drift("A=1\n", None) == "missing on the host"
    said = S.file_drift("A=1\nB=2\n", "A=1\nB=hunter22\n", hide_values=True)
    assert "hunter22" not in said and "B" in said
    assert "--x 2" in S.file_drift("--x 1\n", "--x 2\n")
    assert S.strip_secret_lines('A=1\nHF_TOKEN="t"\n', ["HF_TOKEN"]) == "A=1\n"


def test_uptime_words():
    assert [S.describe_uptime(s) for s in (None, 5, 75, 3700, 90000)] == ["?", "5s", "1m15s", "1h01m", "1d01h"]


def test_a_destroy_preview_warns_only_when_the_stack_serves():
    serving = {"active": True, "runningServer": "as declared"}
    said = S.destroy_warning(unit="sglang-kimi-ep8.service", stack="ep8", where="10.213.1.2", outputs=serving)
    assert said.startswith("destroying stack ep8 stops sglang-kimi-ep8.service, which serves on 10.213.1.2 now")
    assert "nothing will serve on 10.213.1.2 afterwards" in said and "pulumi up --stack" in said
    # Stopped, superseded by another stack, or a state without outputs: the destroy takes nothing away.
    for outputs in ({"active": False}, {"active": True, "runningServer": "superseded: x.service (stack tp8) serves"},
                    {}, None, {"active": "true"}):
        assert S.destroy_warning(unit="u.service", stack="ep8", where="h", outputs=outputs) is None, outputs


def test_what_serves_lists_each_units_own_drop_ins():
    # `systemctl edit` on tp8; the OS's drop-in for every service is not a hand edit of it.
    case = dict(cases("status"))["switch-tp8-to-ep8"]
    own = "/etc/systemd/system/sglang-kimi-k2.6-tp8.service.d/override.conf"
    listed = f"/usr/lib/systemd/system/service.d/10-timeout-abort.conf {own}"
    stdout = case["stdout"].replace("MainPID=77\n", f"MainPID=77\nDropInPaths={listed}\n", 1)
    host = S.parse_serving(stdout)
    assert host.unit("sglang-kimi-k2.6-tp8.service").drop_ins == [own]
    assert all(u.drop_ins == [] for u in S.parse_serving(case["stdout"]).units)


BOOT_CASES = [(n, c) for n, c in cases("status") if "boot" in c]


@pytest.mark.parametrize("name,case", BOOT_CASES, ids=[n for n, _ in BOOT_CASES])
def test_what_a_reboot_would_start_when_it_is_not_what_serves(name, case):
    assert S.boot_disagreement(S.parse_serving(case["stdout"])) == case["boot"]


def test_the_hosts_fitness_lines():
    """`status` per host (core/status.py fitness_lines on fitness_read's read): the drift from the
    benchmark baseline in the drift check's words, what is degraded now, or that there is no baseline."""
    from components.core import fitness_read

    from .core.test_fitness_read import answer
    drifted = fitness_read.parse(answer(dict(cases("fitness-read"))["power-cap-and-link-refused"])).as_dict("gpu1")
    lines = S.fitness_lines(drifted)
    assert lines[0].startswith("  fitness   fitness drift: gpu1 since the benchmark of 2026-12-01 (tp8): GPU 0 ")
    assert lines[1:] == ["  degraded  GPU 0 (00000000:00:06.0): PCIe link x8 of x16",
                         "  degraded  GPU 1 (00000000:00:07.0): power capped at 450 W (default 700 W)"]
    same = fitness_read.parse(answer(dict(cases("fitness-read"))["same-machine-warn"])).as_dict("gpu1")
    assert S.fitness_lines(same) == ["  fitness   as the benchmark of 2026-12-01 (tp8) measured it"]
    assert S.fitness_lines(fitness_read.parse("@@baseline\n@@end\n").as_dict("gpu1")) == [
        "  fitness   no benchmark baseline on this host (`python -m components bench` records one)"]
    assert S.fitness_lines(None) == []  # a host not read (down, unreachable)
