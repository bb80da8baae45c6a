"""Issue 36.20, the small traps of the command lines: a closed pipe (`status | head -3`) ends any
command quietly; `python -m rehearsal down` removes only hosts it is told to; results/ is not
something git would commit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rehearsal.__main__ as rehearsal_cli
from rehearsal import host as rehearsal_host

ROOT = Path(__file__).resolve().parents[1]


def with_closed_stdout(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `argv` writing into a pipe whose reader is already gone (what `| head -3` becomes
    once head has its lines): every write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=cwd, timeout=300,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    finally:
        os.close(write_end)


def status_project(tmp_path: Path) -> Path:
    # A stack on a rehearsal host that is not booted: status prints its screen without a connection.
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.tp8.yaml").write_text("config:\n  gpu-serving:host:\n    rehearsal: pt-closed-pipe\n"
                                              "  gpu-serving:strategy:\n    tpSize: 8\n")
    return tmp_path


@pytest.mark.parametrize("args", [["plan", "--stack", "tp8"], ["plan", "--stack", "tp8", "--json"],
                                  ["plan", "--stack", "ep8", "--against", "tp8"], ["advise", "--stack", "tp8"],
                                  ["status", "--stack", "tp8", "--project-dir", "{project}"]],
                         ids=["plan", "plan-json", "plan-against", "advise", "status"])
def test_a_reader_that_went_away_ends_the_command_without_a_traceback(args, tmp_path):
    argv = [a.replace("{project}", str(status_project(tmp_path))) for a in args]
    done = with_closed_stdout([sys.executable, "-m", "components", *argv])
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141, (done.returncode, done.stderr)  # as a tool killed by SIGPIPE


def test_rehearsal_list_into_a_closed_pipe_is_quiet(tmp_path):
    (tmp_path / "cache" / "rehearsal" / "instances" / "pt-listed").mkdir(parents=True)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "GPU_SERVING_CACHE": str(tmp_path / "cache"),
           "GPU_SERVING_RUN": str(tmp_path / "run")}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "rehearsal", "list"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=120)
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and done.returncode == 141, done.stderr


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Two rehearsal hosts known on a machine of the test's own (instance folders under a private
    cache and run root), and `down` recorded instead of run: a wrong `down` here would otherwise
    power off and delete a host, the shared `default` one included."""
    monkeypatch.setenv("GPU_SERVING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GPU_SERVING_RUN", str(tmp_path / "run"))
    for name in ("pt-one", "pt-two"):
        (tmp_path / "cache" / "rehearsal" / "instances" / name).mkdir(parents=True)
    removed: list[str] = []
    monkeypatch.setattr(rehearsal_host, "down", lambda name, timeout=30.0: removed.append(name))
    return removed


def test_down_without_a_name_removes_nothing_and_says_to_name_one(machine, capsys):
    assert rehearsal_cli.main(["down"]) == 2
    assert machine == []
    err = capsys.readouterr().err
    assert "python -m rehearsal down NAME" in err and "--all" in err


def test_down_of_named_hosts_removes_those_only(machine):
    assert rehearsal_cli.main(["down", "pt-two"]) == 0
    assert machine == ["pt-two"]


def test_down_all_asks_first_and_without_a_terminal_needs_yes(machine, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # no terminal to ask on
    assert rehearsal_cli.main(["down", "--all"]) == 2
    assert machine == []
    err = capsys.readouterr().err
    assert "--yes" in err and "pt-one, pt-two" in err, err
    assert rehearsal_cli.main(["down", "--all", "--yes"]) == 0
    assert machine == ["pt-one", "pt-two"]


def test_down_all_on_a_terminal_takes_only_a_yes(machine, monkeypatch):
    class Terminal:
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stdin", Terminal())
    answers = iter(["", "n", "y"])
    monkeypatch.setattr("builtins.input", lambda question: next(answers))
    assert rehearsal_cli.main(["down", "--all"]) == 2 and machine == []
    assert rehearsal_cli.main(["down", "--all"]) == 2 and machine == []
    assert rehearsal_cli.main(["down", "--all"]) == 0 and machine == ["pt-one", "pt-two"]


def test_down_takes_names_or_all_not_both(machine):
    assert rehearsal_cli.main(["down", "--all", "--yes", "pt-one"]) == 2 and machine == []


def test_benchmark_results_are_not_committed_by_git():
    # `python -m components bench` writes results/bench/<stack>/<time>/ in the project folder.
    from components.core.bench import RESULTS_DIR
    path = ROOT / RESULTS_DIR / "tp8" / "2026-12-01T000000Z" / "c1.jsonl"
    done = subprocess.run(["git", "check-ignore", "-q", str(path.relative_to(ROOT))], cwd=ROOT)
    assert done.returncode == 0, f"{path.relative_to(ROOT)} is not ignored by .gitignore"
