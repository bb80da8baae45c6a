"""Warm start (gpu-serving-pyrun.py `--warm MODULE`, `_gs_warm`): a run in a fork of the project's
warm process behaves as the same run started cold, and nothing stale, foreign or orphaned comes
of it.

The runner here is the repository's, run as our language host and the launcher run it
(`python -u RUNNER --warm MODULE --script|--module ...`), on a tiny warm module in a temporary
project directory; each test has its own socket directory (GPU_SERVING_WARM_DIR), so its warm
processes are its own, found by their command line and ended at its end. The engine-level check
(a real `pulumi preview` and `up` whose program and provider run warm, a CLI killed mid-run) is in
test_engine_warm.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.pulumi_env import REPO
from tests.warm_support import children_of, warm_processes

RUNNER = REPO / "scripts" / "pulumi-build" / "language-python" / "gpu-serving-pyrun.py"

WARM_MODULE = """\
import os
VALUE = {value!r}
LOADED_IN = os.getpid()
"""

# What a run sees: compared between a cold and a warm run of the same command.
PROBE = """\
import json, os, sys
warm = sys.modules.get("warmmod")
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "file": __file__, "name": __name__,
                  "env": os.environ.get("PROBE_X"), "umask": os.umask(0o22),
                  "foreign": sorted(k for k in globals() if k.startswith("_gs")),
                  "stdin": sys.stdin.read(),
                  "warm": None if warm is None else [warm.VALUE, warm.LOADED_IN == os.getppid()]}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def project(tmp_path):
    """(project dir, socket dir, env): a warm module and a probe; the warm processes it started
    are ended at the end."""
    (tmp_path / "warmmod.py").write_text(WARM_MODULE.format(value=1))
    (tmp_path / "probe.py").write_text(PROBE)
    sockets = Path(tempfile.mkdtemp(prefix="gsw-", dir="/tmp"))  # a socket path has at most 107 bytes
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_SERVING_WARM")}
    env.update(GPU_SERVING_WARM_DIR=str(sockets), PROBE_X="x", PYTHONDONTWRITEBYTECODE="1")
    yield tmp_path, sockets, env
    for pid in warm_processes(sockets):
        os.kill(pid, signal.SIGKILL)
    subprocess.run(["rm", "-rf", str(sockets)], check=False)


def run(project_dir: Path, env: dict, *args: str, stdin: str = "", warm: bool = True, timeout: float = 60):
    argv = [sys.executable, "-u", str(RUNNER), *(["--warm", "warmmod"] if warm else []), *args]
    return subprocess.run(argv, cwd=project_dir, env=env, input=stdin, capture_output=True, text=True, timeout=timeout)


def wait_warm(sockets: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if list(sockets.glob("*.sock")):
            return
        time.sleep(0.05)
    pytest.fail(f"no warm process listened in {sockets} within {seconds} s", pytrace=False)


def warm_run(project_dir, sockets, env, *args, **kw):
    """A run that found the warm process up (the first run of a key starts it and runs cold)."""
    wait_warm(sockets)
    proc = run(project_dir, env, *args, **kw)
    return proc


@pytest.mark.parametrize("code", [0, 3])
def test_a_warm_run_sees_what_a_cold_run_sees(project, code):
    project_dir, sockets, env = project
    env = dict(env, PROBE_EXIT=str(code))
    first = run(project_dir, env, "--script", "probe.py", "a", "b", stdin="in")  # starts the warm process
    plain = run(project_dir, env, "--script", "probe.py", "a", "b", stdin="in", warm=False)
    warm = warm_run(project_dir, sockets, env, "--script", "probe.py", "a", "b", stdin="in")
    seen = {name: json.loads(p.stdout.splitlines()[0]) for name, p in (("first", first), ("plain", plain), ("warm", warm))}
    assert first.returncode == plain.returncode == warm.returncode == code, (first.stderr, warm.stderr)
    assert seen["first"]["warm"] is None and seen["plain"]["warm"] is None
    # Forked from the process that imported the warm module: loaded once, not by the run.
    assert seen["warm"]["warm"] == [1, True]
    assert dict(seen["warm"], warm=None) == seen["plain"] == seen["first"]
    assert seen["plain"]["stdin"] == "in" and seen["plain"]["foreign"] == []
    assert warm.stderr == plain.stderr == "to stderr\n"


def test_module_mode_runs_warm_too(project):
    project_dir, sockets, env = project
    pkg = project_dir / "probepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(PROBE)
    run(project_dir, env, "--module", "probepkg")
    plain = run(project_dir, env, "--module", "probepkg", warm=False)
    warm = warm_run(project_dir, sockets, env, "--module", "probepkg")
    a, b = json.loads(plain.stdout.splitlines()[0]), json.loads(warm.stdout.splitlines()[0])
    assert b["warm"] == [1, True]
    assert dict(b, warm=None) == a


def test_an_edited_module_is_never_served_warm(project):
    """An edit of a loaded module makes the warm process stale: that run goes cold (the new code),
    the stale process ends, and the next runs are warm with the new code."""
    project_dir, sockets, env = project
    run(project_dir, env, "--script", "probe.py")
    wait_warm(sockets)
    [old] = warm_processes(sockets)
    assert json.loads(run(project_dir, env, "--script", "probe.py").stdout)["warm"] == [1, True]
    time.sleep(0.01)  # a new mtime even on a coarse clock
    (project_dir / "warmmod.py").write_text(WARM_MODULE.format(value=2))
    after_edit = json.loads(run(project_dir, env, "--script", "probe.py").stdout)
    assert after_edit["warm"] is None  # cold: the edited module is not loaded by the probe
    deadline = time.monotonic() + 10
    while old in warm_processes(sockets) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert old not in warm_processes(sockets), "the stale warm process is still there"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = json.loads(run(project_dir, env, "--script", "probe.py").stdout)["warm"]
        if seen is not None:
            break
        time.sleep(0.1)
    assert seen == [2, True]


def test_signals_reach_the_run_and_its_end_is_the_runners(project):
    project_dir, sockets, env = project
    (project_dir / "slow.py").write_text("import sys, time\nprint('started', flush=True)\ntime.sleep(60)\n")
    run(project_dir, env, "--script", "probe.py")
    wait_warm(sockets)
    for signum, want in ((signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, -signal.SIGTERM)):
        proc = subprocess.Popen([sys.executable, "-u", str(RUNNER), "--warm", "warmmod", "--script", "slow.py"],
                                cwd=project_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "started\n"
        [zygote] = warm_processes(sockets)
        assert children_of(zygote), "the run is not a fork of the warm process"
        proc.send_signal(signum)
        assert proc.wait(timeout=10) == want
        if signum == signal.SIGINT:
            assert "KeyboardInterrupt" in proc.stderr.read()  # raised in the program, as cold
        proc.stdout.close()
        proc.stderr.close()


def has_socket(pid: int) -> bool:
    """Whether the process holds a socket (an fd may close between the listing and its look)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                return True
        except FileNotFoundError:
            pass
    return False


def test_a_signal_before_the_runs_pid_has_come_is_given_to_the_run(project):
    """The engine ends its language host with SIGINT once the program reported an error; on a
    loaded machine that can be before the runner has read the run's PID (seen in CI: a
    KeyboardInterrupt traceback from the runner's own wait in a refused preview's output). The
    warm process is held still (SIGSTOP) while the runner waits for that answer, so the signal
    comes first for sure; the runner keeps it and passes it on once the run exists."""
    project_dir, sockets, env = project
    (project_dir / "slow.py").write_text("import sys, time\nprint('started', flush=True)\ntime.sleep(60)\n")
    run(project_dir, env, "--script", "probe.py")
    wait_warm(sockets)
    [zygote] = warm_processes(sockets)
    os.kill(zygote, signal.SIGSTOP)
    try:
        proc = subprocess.Popen([sys.executable, "-u", str(RUNNER), "--warm", "warmmod", "--script", "slow.py"],
                                cwd=project_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Connected and waiting: the runner's socket to the warm process is open.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not has_socket(proc.pid):
            time.sleep(0.02)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert proc.poll() is None, proc.stderr.read()  # the signal did not end the runner on its own
    finally:
        os.kill(zygote, signal.SIGCONT)
    assert proc.wait(timeout=20) == -signal.SIGINT  # the run got it and ended by it, as a cold run would
    err = proc.stderr.read()
    assert "read_line" not in err and "relay" not in err, err  # no traceback from the runner's own wait
    proc.stdout.close()
    proc.stderr.close()
    assert children_of(zygote) == []


def test_a_killed_runner_takes_its_run_with_it(project):
    project_dir, sockets, env = project
    (project_dir / "slow.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    run(project_dir, env, "--script", "probe.py")
    wait_warm(sockets)
    [zygote] = warm_processes(sockets)
    proc = subprocess.Popen([sys.executable, "-u", str(RUNNER), "--warm", "warmmod", "--script", "slow.py"],
                            cwd=project_dir, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "started\n"
    [child] = children_of(zygote)
    proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()
    deadline = time.monotonic() + 5
    while children_of(zygote) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children_of(zygote) == [], f"the run (pid {child}) outlived its runner"
    assert warm_processes(sockets) == [zygote]  # the warm process itself stays for the next run


def test_the_warm_process_holds_no_stream_and_no_secret_of_the_run_that_started_it(project):
    """Started by a run whose output is a pipe (the engine reads the provider's), it must not hold
    that pipe, or the reader would wait for it; and it keeps none of the run's variables but what
    changes an import."""
    project_dir, sockets, env = project
    env = dict(env, PULUMI_CONFIG_PASSPHRASE="hunter2-passphrase", PULUMI_CONFIG='{"k": "secret-value"}')
    # It returns at EOF of its pipes: a warm process that held them would keep the run waiting
    # until `run`'s timeout (TimeoutExpired), so that is the check, not a duration.
    proc = run(project_dir, env, "--script", "probe.py", timeout=60)
    assert proc.returncode == 0
    wait_warm(sockets)
    [zygote] = warm_processes(sockets)
    environ = Path(f"/proc/{zygote}/environ").read_bytes()
    assert b"hunter2" not in environ and b"secret-value" not in environ
    fds = {os.readlink(f"/proc/{zygote}/fd/{fd}") for fd in os.listdir(f"/proc/{zygote}/fd")}
    assert not [f for f in fds if f.startswith("pipe:")], fds
    # The run itself gets them all, as a cold run would.
    warm = json.loads(run(project_dir, dict(env, PROBE_X="hunter2-passphrase"), "--script", "probe.py").stdout)
    assert warm["warm"] == [1, True] and warm["env"] == "hunter2-passphrase"


def test_off_unsafe_place_or_traced_runs_stay_cold(project):
    project_dir, sockets, env = project
    for extra in ({"GPU_SERVING_WARM_START": "0"}, {"TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}):
        proc = run(project_dir, dict(env, **extra), "--script", "probe.py")
        assert proc.returncode == 0 and json.loads(proc.stdout)["warm"] is None
        time.sleep(0.5)
        assert not list(sockets.glob("*.sock")) and not warm_processes(sockets), extra
    os.chmod(sockets, 0o755)  # another user could place a socket there: never used
    proc = run(project_dir, env, "--script", "probe.py")
    assert proc.returncode == 0 and json.loads(proc.stdout)["warm"] is None
    time.sleep(0.5)
    assert not warm_processes(sockets)


def test_runs_at_once_each_get_a_copy_and_an_idle_warm_process_ends(project):
    project_dir, sockets, env = project
    env = dict(env, GPU_SERVING_WARM_IDLE_SECONDS="2")
    (project_dir / "slow.py").write_text("import os, sys, time\ntime.sleep(1)\nprint(os.getpid(), 'warmmod' in sys.modules)\n")
    run(project_dir, env, "--script", "probe.py")
    wait_warm(sockets)
    procs = [subprocess.Popen([sys.executable, "-u", str(RUNNER), "--warm", "warmmod", "--script", "slow.py"],
                              cwd=project_dir, env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=30)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({pid for pid, _ in outs}) == 3 and all(w == "True" for _, w in outs), outs
    deadline = time.monotonic() + 10
    while warm_processes(sockets) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not warm_processes(sockets), "the idle warm process did not end"
    assert not list(sockets.glob("*.sock"))


def test_a_closed_standard_stream_runs_cold(project):
    """A runner without a stdin cannot hand one over: nothing is forked, the run goes cold."""
    project_dir, sockets, env = project
    (project_dir / "hello.py").write_text("import sys\nprint('hello', sys.stdin is None)\n")
    run(project_dir, env, "--script", "probe.py")
    wait_warm(sockets)
    proc = subprocess.run(["bash", "-c", 'exec "$0" -u "$1" --warm warmmod --script hello.py <&-', sys.executable,
                           str(RUNNER)], cwd=project_dir, env=env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "hello True\n"), proc.stderr
    [zygote] = warm_processes(sockets)
    assert children_of(zygote) == []


def test_a_broken_warm_module_runs_cold_until_it_is_fixed(project):
    project_dir, sockets, env = project
    (project_dir / "warmmod.py").write_text("VALUE = (\n")  # a syntax error
    for _ in range(2):
        proc = run(project_dir, env, "--script", "probe.py")
        assert proc.returncode == 0 and json.loads(proc.stdout)["warm"] is None, proc.stderr
        wait_warm(sockets)
    (project_dir / "warmmod.py").write_text(WARM_MODULE.format(value=3))
    deadline = time.monotonic() + 30
    seen = None
    while time.monotonic() < deadline and seen is None:
        seen = json.loads(run(project_dir, env, "--script", "probe.py").stdout)["warm"]
        time.sleep(0.1)
    assert seen == [3, True], "the fixed module never ran warm"


def test_warm_processes_ending_and_starting_under_runs_never_fail_one(project):
    """Runs three at a time while warm processes keep ending (idle after 0.1 s) and starting
    (each run that finds none starts one; two at once race for the socket and one ends): a
    runner whose warm process ends under it, before it answered, goes cold; none fails, none runs
    twice (each prints once), each sees its own environment."""
    project_dir, sockets, env = project
    env = dict(env, GPU_SERVING_WARM_IDLE_SECONDS="0.1")
    (project_dir / "once.py").write_text("import os, sys\nprint(os.environ['RUN'], 'warmmod' in sys.modules)\n")
    seen = []
    for batch in range(12):
        procs = [subprocess.Popen([sys.executable, "-u", str(RUNNER), "--warm", "warmmod", "--script", "once.py"],
                                  cwd=project_dir, env=dict(env, RUN=f"{batch}.{i}"), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(3)]
        for i, p in enumerate(procs):
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            assert out.split()[0] == f"{batch}.{i}" and len(out.splitlines()) == 1, (out, err)
            seen.append(out.split()[1])
        time.sleep(0.05 * (batch % 4))
    assert "True" in seen, "no run was warm"
