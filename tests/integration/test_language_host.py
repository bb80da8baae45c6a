"""Our Python language host (scripts/pulumi-build/language-python) and the dynamic-provider
launcher, at their interfaces.

- The host answers what the engine needs: GetPluginInfo, About (the interpreter and its version),
  GetProgramDependencies (the venv's distributions, for `pulumi about`). The package questions
  (GetRequiredPackages / GetRequiredPlugins) are UNIMPLEMENTED, which the engine takes as "no
  plugins known in advance" (tests/integration/test_engine.py runs real stacks that way), and
  answering them starts no Python.
- The host exits when the process that started it (the engine) is gone, and the program it runs
  goes with it; the runner (the program, the dynamic provider) exits when its parent is gone.
  tests/integration/test_engine_gone.py kills the real CLI mid-run.
- gpu-serving-pyrun.py runs a script / module as plain `python` would (argv, sys.path[0], __file__,
  exit status, atexit, threads, unclosed files flushed) and the launcher `exec`s Python and exits
  promptly on the engine's SIGINT.

The host under test is the cached engine's (scripts/bootstrap-pulumi), or the binary named by
GPU_SERVING_LANGHOST_UNDER_TEST (a development build). Marked `engine`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, provider_pb2_grpc

from tests.pulumi_env import REPO, EngineMissing, engine_env, require_engine

pytestmark = pytest.mark.engine

SRC = REPO / "scripts" / "pulumi-build" / "language-python"
RUNNER = SRC / "gpu-serving-pyrun.py"
LAUNCHER = SRC / "pulumi-resource-pulumi-python"
VENV = REPO / ".venv"


@pytest.fixture(scope="module")
def langhost() -> Path:
    override = os.environ.get("GPU_SERVING_LANGHOST_UNDER_TEST")
    if override:
        return Path(override)
    try:
        return require_engine(engine_env()) / "pulumi-language-python"
    except EngineMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@contextmanager
def host(binary: Path, extra_env: dict | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env.update(extra_env or {})
    proc = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield language_pb2_grpc.LanguageRuntimeStub(channel)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def program_info(root: Path, venv: Path) -> language_pb2.ProgramInfo:
    options = struct_pb2.Struct()
    options.update({"toolchain": "pip", "virtualenv": str(venv)})
    return language_pb2.ProgramInfo(root_directory=str(root), program_directory=str(root), entry_point=".",
                                    options=options)


def pythons_started_by(binary: Path, call, tmp_path: Path) -> int:
    """How many Pythons the host starts to answer `call(stub, info)`: its venv's bin/python is a
    wrapper that counts its starts, then runs the real interpreter."""
    venv = tmp_path / "counting-venv"
    (venv / "bin").mkdir(parents=True)
    starts = tmp_path / "starts"
    (venv / "bin" / "python").write_text(f'#!/bin/sh\necho x >> {starts}\nexec {VENV / "bin" / "python"} "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    with host(binary) as stub:
        call(stub, program_info(tmp_path, venv))
    return len(starts.read_text().splitlines()) if starts.exists() else 0


# ---- what the engine asks --------------------------------------------------------------------

def test_package_questions_are_unimplemented_without_starting_python(langhost, tmp_path):
    """The engine takes UNIMPLEMENTED for both as "no plugins known in advance"; the answer is
    fixed, so no interpreter is started for it."""
    def ask(stub, info):
        for call, req in ((stub.GetRequiredPackages, language_pb2.GetRequiredPackagesRequest(info=info)),
                          (stub.GetRequiredPlugins, language_pb2.GetRequiredPluginsRequest(info=info))):
            with pytest.raises(grpc.RpcError) as err:
                call(req, timeout=30)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, err.value
    assert pythons_started_by(langhost, ask, tmp_path) == 0


def test_about_is_the_interpreter_and_its_version(langhost, tmp_path):
    want = subprocess.run([str(VENV / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with host(langhost) as stub:
        about = stub.About(language_pb2.AboutRequest(info=program_info(REPO, VENV)), timeout=30)
        plugin = stub.GetPluginInfo(empty_pb2.Empty(), timeout=30)
    assert about.version == want
    assert about.executable == str(VENV / "bin" / "python")
    assert about.metadata["virtualenv"] == str(VENV)
    assert plugin.version


def test_program_dependencies_are_the_venvs_distributions(langhost):
    with host(langhost) as stub:
        resp = stub.GetProgramDependencies(language_pb2.GetProgramDependenciesRequest(info=program_info(REPO, VENV)),
                                           timeout=60)
    got = {d.name.lower(): d.version for d in resp.dependencies}
    want = json.loads(subprocess.run(
        [str(VENV / "bin" / "python"), "-c",
         "import json, importlib.metadata as md; "
         "print(json.dumps({d.metadata['Name'].lower(): d.version for d in md.distributions()}))"],
        capture_output=True, text=True, check=True, cwd=REPO).stdout)
    assert got == want
    assert {"pulumi", "pydantic", "paramiko"} <= set(got), sorted(got)


def test_missing_virtualenv_is_named(langhost, tmp_path):
    missing = tmp_path / "no-such-venv"
    with host(langhost) as stub:
        with pytest.raises(grpc.RpcError) as err:
            stub.About(language_pb2.AboutRequest(info=program_info(tmp_path, missing)), timeout=30)
    assert f"the virtualenv {missing}" in err.value.details() and "has no bin/python" in err.value.details()


# ---- exiting with the engine -----------------------------------------------------------------

def start_orphanable(argv: list[str], tmp_path: Path, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    """Start argv under an intermediate shell (its "engine") and return (shell, argv's PID). The
    shell waits until it gets SIGKILL; argv's first output line is ignored (the host's port)."""
    pidfile = tmp_path / "child.pid"
    shell = subprocess.Popen(["sh", "-c", '"$@" > /dev/null & echo $! > "$0"; wait', str(pidfile), *argv],
                             env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.05)
    return shell, int(pidfile.read_text())


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # ended, its new parent not yet reaping
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("what", ["language host", "runner"])
def test_exits_when_its_parent_is_killed(langhost, tmp_path, what):
    if what == "language host":
        argv = [str(langhost)]
    else:  # the runner with a program that would wait for ever
        script = tmp_path / "forever.py"
        script.write_text("import time\nwhile True:\n    time.sleep(60)\n")
        argv = [sys.executable, "-u", str(RUNNER), "--script", str(script)]
    shell, child = start_orphanable(argv, tmp_path)
    try:
        time.sleep(1.0)
        assert not gone_within(child, 0), f"the {what} ended on its own"
        os.kill(shell.pid, signal.SIGKILL)
        shell.wait(timeout=10)
        assert gone_within(child, 5), f"the {what} (pid {child}) outlived its parent"
    finally:
        if not gone_within(child, 0):
            os.kill(child, signal.SIGKILL)


# ---- gpu-serving-pyrun.py and the launcher -----------------------------------------------------

PROBE = """\
import atexit, json, os, sys, threading, time
out = open(sys.argv[1] + ".data", "w")  # never closed: the teardown used to flush it
out.write("unclosed-data")
atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").write("ran"))
def late():
    time.sleep(0.3)
    open(sys.argv[1] + ".thread", "w").write("done")
threading.Thread(target=late).start()
main = sys.modules["__main__"]
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": globals().get("__file__"),
                  "name": __name__, "spec": [getattr(__spec__, "name", None), getattr(__spec__, "origin", None)],
                  "cached": globals().get("__cached__"),
                  "main_is_globals": main.__dict__ is globals(),
                  "foreign": sorted(k for k in globals() if k.startswith("_gs"))}))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def run_probe(tmp_path: Path, argv: list[str], tag: str, code: int) -> tuple[dict, subprocess.CompletedProcess]:
    marker = tmp_path / tag
    env = dict(os.environ, PROBE_EXIT=str(code))
    proc = subprocess.run([*argv, str(marker)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    seen = json.loads(proc.stdout.splitlines()[0])
    assert (tmp_path / f"{tag}.data").read_text() == "unclosed-data"
    assert (tmp_path / f"{tag}.atexit").read_text() == "ran"
    assert (tmp_path / f"{tag}.thread").read_text() == "done"
    seen["argv"] = seen["argv"][:-1]  # the marker differs
    return seen, proc


@pytest.mark.parametrize("code", [0, 3])
def test_runner_script_mode_matches_plain_python(tmp_path, code):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    plain, p1 = run_probe(tmp_path, [sys.executable, "-u", str(script)], "plain", code)
    fast, p2 = run_probe(tmp_path, [sys.executable, "-u", str(RUNNER), "--script", str(script)], "fast", code)
    assert p1.returncode == p2.returncode == code, (p1.stderr, p2.stderr)
    assert fast == plain
    assert plain["foreign"] == []


def test_runner_module_mode_matches_dash_m(tmp_path):
    pkg = tmp_path / "probepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(PROBE)
    plain, p1 = run_probe(tmp_path, [sys.executable, "-u", "-m", "probepkg"], "plain", 0)
    fast, p2 = run_probe(tmp_path, [sys.executable, "-u", str(RUNNER), "--module", "probepkg"], "fast", 0)
    assert p1.returncode == p2.returncode == 0, (p1.stderr, p2.stderr)
    assert fast == plain


DEFERRED_PROBE = """\
import json, sys
import pulumi
loaded_after_import = sorted(m for m in sys.modules if m.startswith("pulumi.automation."))
from pulumi.automation import fully_qualified_stack_name
import pulumi.automation as auto
print(json.dumps({"loaded_after_import": loaded_after_import,
                  "qualified": fully_qualified_stack_name("org", "proj", "stack"),
                  "workspace": auto.LocalWorkspace.__name__, "same": pulumi.automation.LocalWorkspace is auto.LocalWorkspace,
                  "module": type(sys.modules["pulumi.automation"]).__name__}))
"""


def test_runner_defers_the_automation_api_until_used(tmp_path):
    """`import pulumi` under the runner does not import the Automation API (neither the program
    nor the dynamic provider uses it: issue 18's start-up cut); the first use imports it, and
    then it is the real module, as under plain python."""
    script = tmp_path / "deferred.py"
    script.write_text(DEFERRED_PROBE)
    out = {}
    for how, argv in (("plain", [sys.executable, str(script)]), ("runner", [sys.executable, str(RUNNER), "--script", str(script)])):
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[how] = json.loads(proc.stdout)
    assert out["plain"]["loaded_after_import"], "plain python imports pulumi.automation's modules with pulumi"
    assert out["runner"]["loaded_after_import"] == []
    assert out["runner"] == dict(out["plain"], loaded_after_import=[])
    assert out["runner"]["qualified"] == "org/proj/stack" and out["runner"]["module"] == "module"


LAZY_PROBE = """\
import importlib.util, sys
spec = importlib.util.find_spec("heavy")
spec.loader = importlib.util.LazyLoader(spec.loader)
module = importlib.util.module_from_spec(spec)
sys.modules["heavy"] = module
spec.loader.exec_module(module)  # loaded on its first attribute access, which never comes
"""


def test_runner_exit_does_not_load_a_lazily_loaded_module(tmp_path):
    """The runner's exit flushes every open file, found by walking the objects: that walk must
    not touch a LazyLoader module (the program's paramiko), or it imports it at exit."""
    marker = tmp_path / "loaded"
    (tmp_path / "heavy.py").write_text(f"open({str(marker)!r}, 'w').write('loaded')\n")
    script = tmp_path / "lazy.py"
    script.write_text(LAZY_PROBE)
    proc = subprocess.run([sys.executable, str(RUNNER), "--script", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()


def test_runner_unusual_exits_are_pythons(tmp_path):
    script = tmp_path / "exits.py"
    for body, want_rc, want_err in (("raise SystemExit('bye')", 1, "bye"),
                                    ("raise ValueError('boom')", 1, "ValueError: boom"),
                                    ("raise SystemExit(300)", 300 & 0xFF, "")):
        script.write_text(body + "\n")
        proc = subprocess.run([sys.executable, str(RUNNER), "--script", str(script)], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == want_rc, (body, proc.stderr)
        assert want_err in proc.stderr


EXITING = """\
import atexit, os, sys, threading, time
marker = sys.argv[1]
def late_exit_step():
    open(marker + ".atexit-started", "w").close()
    time.sleep(float(os.environ["ATEXIT_SECONDS"]))
    open(marker + ".atexit", "w").write("ran")
atexit.register(late_exit_step)
threading.Thread(target=time.sleep, args=(float(os.environ["THREAD_SECONDS"]),)).start()  # the exit waits for it
print("ended", flush=True)
sys.exit(3)  # a failed run, as pulumi-language-python-exec ends one
"""


@pytest.mark.parametrize("during", ["the wait for the program's threads", "an atexit handler"])
def test_runner_sigint_after_the_program_ended_exits_quietly_with_its_status(tmp_path, during):
    """The engine closes a plugin by sending SIGINT to its process group, which holds the program
    our language host runs: after a failed `pulumi up` it can land while the program is already
    exiting. That used to print a KeyboardInterrupt traceback from the runner's own exit routine
    under the real error (and end the process by the signal)."""
    script = tmp_path / "exiting.py"
    script.write_text(EXITING)
    marker = tmp_path / "m"
    in_threads = during.startswith("the wait")
    env = dict(os.environ, THREAD_SECONDS="30" if in_threads else "0", ATEXIT_SECONDS="0" if in_threads else "1")
    proc = subprocess.Popen([sys.executable, "-u", str(RUNNER), "--script", str(script), str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout.readline() == "ended\n"
        if in_threads:
            time.sleep(0.5)  # in threading's shutdown, waiting for the sleeping thread
        else:
            deadline = time.monotonic() + 10
            while not (tmp_path / "m.atexit-started").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert (tmp_path / "m.atexit").read_text() == "ran"  # the exit steps after the wait still ran
    if in_threads:
        # The bound is the promise (it stopped waiting for the 30 s thread): kept well below 30 s.
        assert time.monotonic() - started < 20


def test_launcher_execs_python_and_stops_on_sigint(tmp_path):
    env = dict(os.environ, PULUMI_RUNTIME_VIRTUALENV=str(VENV))
    proc = subprocess.Popen([str(LAUNCHER), "127.0.0.1:1"], stdout=subprocess.PIPE, env=env, cwd=tmp_path,
                            start_new_session=True, text=True)
    try:
        port = int(proc.stdout.readline())
        # exec: the process the engine started is the interpreter itself, not a shell.
        assert Path(f"/proc/{proc.pid}/exe").resolve().name.startswith("python")
        # As the engine does: use the provider, and signal it only at the end (the SDK's server
        # prints the port just before it starts waiting for the signal).
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = provider_pb2_grpc.ResourceProviderStub(channel).GetPluginInfo(empty_pb2.Empty(), timeout=30)
        assert info.version
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what the engine does when it closes the plugin
        # It stops on the signal (exit 0); the wait's bound only keeps a launcher that ignored it
        # from hanging the test, with room for a loaded machine.
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("what", ["language host", "provider launcher"])
def test_sigint_ends_it_even_when_it_was_started_with_sigint_ignored(langhost, tmp_path, what):
    """A `pulumi` command started with SIGINT ignored (`&` in a script, nohup) passes that on to
    the plugins the engine starts. The engine stops a plugin with SIGINT to its process group and
    waits 5 s before SIGKILL: the language host ignored it, and every command waited those 5 s."""
    argv = [str(langhost), "127.0.0.1:1"] if what == "language host" else [str(LAUNCHER), "127.0.0.1:1"]
    env = dict(os.environ, PULUMI_RUNTIME_VIRTUALENV=str(VENV))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, cwd=tmp_path, start_new_session=True, text=True,
                            preexec_fn=_sigint_ignored)
    try:
        assert int(proc.stdout.readline()) > 0  # serving
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what the engine does when it closes the plugin
        # Ended by it (the language host as Go's default would: 130; the provider cleanly: 0),
        # not still there when the engine's 5 s are over.
        assert proc.wait(timeout=4) in (0, 130)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_launcher_missing_virtualenv_message(tmp_path):
    env = dict(os.environ, PULUMI_RUNTIME_VIRTUALENV="no-venv-here")
    proc = subprocess.run([str(LAUNCHER), "127.0.0.1:1"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=60)
    assert proc.returncode == 1
    assert f"virtualenv {tmp_path}/no-venv-here (Pulumi.yaml runtime.options.virtualenv)" in proc.stderr
    assert "scripts/setup" in proc.stderr


def test_launcher_serves_as_many_calls_at_once_as_a_fleet_makes(tmp_path):
    """A fleet switch holds one provider call per host for the whole readiness wait: 8 creates
    that each wait for all 8 to be running must all succeed (the SDK's own server has 4 threads:
    there they would time out, the first four waiting for the others)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from pulumi.dynamic.dynamic import serialize_provider
    from pulumi.runtime import rpc
    from pulumi.runtime.proto import provider_pb2

    from tests import provider_pool_support as support

    provider = serialize_provider(support.WaitForAll())
    env = dict(os.environ, PULUMI_RUNTIME_VIRTUALENV=str(VENV), PYTHONPATH=str(REPO))
    proc = subprocess.Popen([str(LAUNCHER), "127.0.0.1:1"], stdout=subprocess.PIPE, env=env, cwd=REPO,
                            start_new_session=True, text=True)
    try:
        port = int(proc.stdout.readline())

        def create(n):
            props = asyncio.run(rpc.serialize_properties({"__provider": provider, "n": n}, {}))
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                return provider_pb2_grpc.ResourceProviderStub(channel).Create(
                    provider_pb2.CreateRequest(urn=f"urn:pulumi:s::p::t::r{n}", properties=props), timeout=60)
        with ThreadPoolExecutor(support.PARTIES) as pool:
            ids = sorted(int(r.id) for r in pool.map(create, range(support.PARTIES)))
        assert ids == list(range(support.PARTIES))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


FAKE_AHEAD = '''
import json, os
def handle(token, args):
    with open("calls.jsonl", "a") as f:
        f.write(json.dumps([token, args]) + "\\n")
    if token.endswith(":ours"):
        return {"seen": token, "n": args.get("n")}
    return None
'''


@pytest.mark.parametrize("with_module", [True, False], ids=["the project's module", "a project without it"])
def test_launcher_gives_the_providers_invokes_to_the_projects_module(tmp_path, with_module):
    """The dynamic provider's Invoke goes to the project's components/remote/ahead.py first (the
    launcher's --invokes); what it does not answer, and every call of a project without that
    module, gets the SDK server's "not implemented", as before."""
    if with_module:
        (tmp_path / "components" / "remote").mkdir(parents=True)
        (tmp_path / "components" / "__init__.py").write_text("")
        (tmp_path / "components" / "remote" / "__init__.py").write_text("")
        (tmp_path / "components" / "remote" / "ahead.py").write_text(FAKE_AHEAD)
    from pulumi.runtime.proto import provider_pb2

    from tests.pulumi_env import provider_process

    with provider_process(tmp_path) as stub:
        def invoke(token):
            args = struct_pb2.Struct()
            args.update({"n": 3})
            return stub.Invoke(provider_pb2.InvokeRequest(tok=token, args=args), timeout=30)

        if with_module:
            answer = getattr(invoke("pulumi-python:dynamic:ours"), "return")
            assert dict(answer) == {"seen": "pulumi-python:dynamic:ours", "n": 3}
        for token in ("pulumi-python:dynamic:ours", "pulumi-python:dynamic:notOurs")[1 if with_module else 0:]:
            with pytest.raises(grpc.RpcError) as info:
                invoke(token)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "not implemented" in info.value.details().lower()
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()] if with_module else []
    assert calls == ([["pulumi-python:dynamic:ours", {"n": 3}], ["pulumi-python:dynamic:notOurs", {"n": 3}]]
                     if with_module else [])
