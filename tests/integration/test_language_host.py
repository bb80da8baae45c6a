"""Our Python language host (scripts/pulumi-build/language-python) and the dynamic-provider
launcher, at their interfaces.

- The host answers GetRequiredPackages / GetRequiredPlugins / GetProgramDependencies by reading
  the virtualenv's files in Go (pyscan.go) instead of running a Python script. These tests ask the
  same questions over gRPC with GPU_SERVING_LANGHOST_SCAN=go (Go only, no fallback) and =python
  (the original scripts, i.e. Python's own view through importlib.metadata) and require identical
  answers: on the project's .venv, and on fresh virtualenvs of every CPython 3.10-3.13 found on
  this machine holding fake packages (dist-info, egg-info, quoted RECORD paths, a .pth-added
  directory, PYTHONPATH, parameterized and nameless plugins, plugins that must NOT count). A
  .pth line that runs unknown code is not modelled: the default mode must then fall back to
  Python (same answer), and the Go-only mode must say so.
- About's version (cached per interpreter binary) is the interpreter's platform.python_version().
- gpu-serving-pyrun.py runs a script / module as plain `python` would (argv, sys.path[0], __file__,
  exit status, atexit, threads, unclosed files flushed) and the launcher `exec`s Python and exits
  promptly on the engine's SIGINT.

The host under test is the cached engine's (scripts/bootstrap-pulumi), or the binary named by
GPU_SERVING_LANGHOST_UNDER_TEST (a development build). Marked `engine`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
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
def host(binary: Path, mode: str, extra_env: dict | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["GPU_SERVING_LANGHOST_SCAN"] = mode
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


def answers(binary: Path, mode: str, root: Path, venv: Path, extra_env: dict | None = None) -> dict:
    """Everything the host says about the program's packages, or the error it gives."""
    info = program_info(root, venv)
    out = {}
    with host(binary, mode, extra_env) as stub:
        for name, call in (
            ("packages", lambda: stub.GetRequiredPackages(language_pb2.GetRequiredPackagesRequest(info=info))),
            ("plugins", lambda: stub.GetRequiredPlugins(language_pb2.GetRequiredPluginsRequest(info=info))),
            ("dependencies", lambda: stub.GetProgramDependencies(
                language_pb2.GetProgramDependenciesRequest(info=info))),
        ):
            try:
                resp = call()
            except grpc.RpcError as exc:
                out[name] = ("error", exc.details())
                continue
            if name == "packages":
                out[name] = [(p.kind, p.name, p.version, p.server,
                              (p.parameterization.name, p.parameterization.version, p.parameterization.value)
                              if p.HasField("parameterization") else None) for p in resp.packages]
            elif name == "plugins":
                out[name] = [(p.kind, p.name, p.version, p.server) for p in resp.plugins]
            else:
                out[name] = [(d.name, d.version) for d in resp.dependencies]
    return out


# ---- fake packages -----------------------------------------------------------------------------

def dist_info(site: Path, dirname: str, name: str, version: str, record: list[str],
              files: dict[str, str] | None = None) -> None:
    d = site / dirname
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: fake\n\nbody\n")
    (d / "RECORD").write_text("".join(line + "\n" for line in record))
    for rel, text in (files or {}).items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)


def plugin(**fields) -> str:
    return json.dumps(fields)


def make_fake_packages(site: Path, extra: Path, elsewhere: Path) -> None:
    """Packages that exercise every rule of the plugin scan. `extra` is added by a .pth file,
    `elsewhere` by PYTHONPATH."""
    dist_info(site, "pulumi_fakeone-1.2.3.dist-info", "pulumi_fakeone", "1.2.3",
              ["pulumi_fakeone/__init__.py,,", "pulumi_fakeone/pulumi-plugin.json,sha256=x,40",
               "pulumi_fakeone-1.2.3.dist-info/RECORD,,"],
              {"pulumi_fakeone/__init__.py": "", "pulumi_fakeone/pulumi-plugin.json":
               plugin(resource=True, name="fakeone", version="1.2.3", server="https://example.invalid/fake")})
    # No name / version in the plugin file: taken from the distribution (pulumi- prefix dropped).
    dist_info(site, "pulumi_nameless-0.5.0.dist-info", "pulumi-nameless", "0.5.0",
              ["pulumi_nameless/pulumi-plugin.json,,"],
              {"pulumi_nameless/pulumi-plugin.json": plugin(resource=1)})
    # Parameterized: a package, but not a plugin for GetRequiredPlugins.
    dist_info(site, "Param_Pkg-2.0.dist-info", "Param-Pkg", "2.0",
              ['"param pkg/pulumi-plugin.json",,'],  # quoted path with a space
              {"param pkg/pulumi-plugin.json": plugin(
                  resource=True, name="terraform-provider", version="0.10.0",
                  parameterization={"name": "aws-tf", "version": "5.1.0",
                                    "value": base64.b64encode(b"parameter").decode()})})
    # Not counted: resource false/empty, plugin file not in RECORD, unparsable JSON, not an object.
    dist_info(site, "notprovider-1.0.dist-info", "notprovider", "1.0",
              ["notprovider/pulumi-plugin.json,,"], {"notprovider/pulumi-plugin.json": plugin(resource=False, name="no")})
    dist_info(site, "emptyres-1.0.dist-info", "emptyres", "1.0",
              ["emptyres/pulumi-plugin.json,,"], {"emptyres/pulumi-plugin.json": plugin(resource=[], name="no2")})
    dist_info(site, "unlisted-1.0.dist-info", "unlisted", "1.0", ["unlisted/__init__.py,,"],
              {"unlisted/__init__.py": "", "unlisted/pulumi-plugin.json": plugin(resource=True, name="unlisted")})
    dist_info(site, "badjson-1.0.dist-info", "badjson", "1.0", ["badjson/pulumi-plugin.json,,"],
              {"badjson/pulumi-plugin.json": "{not json"})
    dist_info(site, "listjson-1.0.dist-info", "listjson", "1.0", ["listjson/pulumi-plugin.json,,"],
              {"listjson/pulumi-plugin.json": "[1, 2]"})
    dist_info(site, "missingfile-1.0.dist-info", "missingfile", "1.0", ["missingfile/pulumi-plugin.json,,"])
    # The same plugin declared twice: reported once.
    dist_info(site, "pulumi_dup-1.2.3.dist-info", "pulumi_dup", "1.2.3", ["pulumi_dup/pulumi-plugin.json,,"],
              {"pulumi_dup/pulumi-plugin.json": plugin(resource=True, name="fakeone", version="1.2.3",
                                                       server="https://example.invalid/fake")})
    # egg-info with SOURCES.txt (no RECORD), and a distribution without files at all.
    egg = site / "eggy-3.0-py3.11.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: eggy\nVersion: 3.0\n")
    (egg / "SOURCES.txt").write_text("setup.py\neggy/pulumi-plugin.json\n")
    (site / "eggy").mkdir()
    (site / "eggy" / "pulumi-plugin.json").write_text(plugin(resource="yes", name="eggy"))
    (site / "nofiles-1.0.dist-info").mkdir()
    (site / "nofiles-1.0.dist-info" / "METADATA").write_text("Name: nofiles\nVersion: 1.0\n")
    # A directory added by a .pth file (and a .pth path that does not exist), with its own plugin.
    (site / "zz-extra.pth").write_text(f"# comment\n{extra}\n/does/not/exist\n\n")
    dist_info(extra, "pulumi_extra-9.9.9.dist-info", "pulumi_extra", "9.9.9", ["pulumi_extra/pulumi-plugin.json,,"],
              {"pulumi_extra/pulumi-plugin.json": plugin(resource=True)})
    dist_info(elsewhere, "pulumi_viapath-0.0.1.dist-info", "pulumi_viapath", "0.0.1",
              ["pulumi_viapath/pulumi-plugin.json,,"],
              {"pulumi_viapath/pulumi-plugin.json": plugin(resource=True, name="viapath", version="0.0.1")})
    # RECORD paths as csv writes them: a quoted field with a comma and a doubled quote; CRLF line
    # ends; an absolute path; a path out of site-packages.
    dist_info(site, "quoted-1.0.dist-info", "quoted", "1.0", ['"q,uo""ted/pulumi-plugin.json",sha256=abc,12'],
              {'q,uo"ted/pulumi-plugin.json': plugin(resource=True, name="quoted", version="1.0")})
    (site / "crlf-1.0.dist-info").mkdir()
    (site / "crlf-1.0.dist-info" / "METADATA").write_text("Name: crlf\r\nVersion: 1.0\r\n\r\n")
    (site / "crlf-1.0.dist-info" / "RECORD").write_bytes(b"crlf/__init__.py,,\r\ncrlf/pulumi-plugin.json,,\r\n")
    (site / "crlf").mkdir()
    (site / "crlf" / "pulumi-plugin.json").write_text(plugin(resource=True))
    outside = site.parents[3] / "outside"
    dist_info(site, "absolute-1.0.dist-info", "absolute", "1.0",
              [f"{outside}/abs/pulumi-plugin.json,,", "../../../../outside/rel/pulumi-plugin.json,,"],
              {f"{outside}/abs/pulumi-plugin.json": plugin(resource=True, name="absolute", version="1"),
               f"{outside}/rel/pulumi-plugin.json": plugin(resource=True, name="dotdot", version="2")})
    # Metadata fields: keys are case-insensitive, trailing blanks are part of the value.
    d = site / "hdr-1.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nname: pulumi-lower-key\nVersion: 1.0  \nName: second\n")
    (d / "RECORD").write_text("hdr/pulumi-plugin.json,,\n")
    (site / "hdr").mkdir()
    (site / "hdr" / "pulumi-plugin.json").write_text(plugin(resource=True))
    # An old-style egg-info *file* (metadata only, no files).
    (site / "filey-1.0-py3.egg-info").write_text("Metadata-Version: 1.0\nName: filey\nVersion: 1.0\n")


EXPECTED_PLUGINS = {
    ("resource", "fakeone", "1.2.3", "https://example.invalid/fake"),
    ("resource", "nameless", "0.5.0", ""),
    ("resource", "eggy", "3.0", ""),
    ("resource", "extra", "9.9.9", ""),
    ("resource", "viapath", "0.0.1", ""),
    ("resource", "quoted", "1.0", ""),
    ("resource", "crlf", "1.0", ""),
    ("resource", "absolute", "1", ""),
    ("resource", "dotdot", "2", ""),
    ("resource", "lower-key", "1.0  ", ""),
}


def interpreters() -> list[tuple[str, str]]:
    """(id, path): the CPython 3.10-3.13 interpreters on this machine: the running one, the
    system's (Debian's has a sitecustomize), pyenv's."""
    found: dict[str, str] = {}
    candidates = [sys.executable, "/usr/bin/python3"] + [shutil.which(f"python3.{m}") or "" for m in range(10, 14)]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.1[0-3].*/bin/python3"))
    for c in filter(None, candidates):
        try:
            base, v = subprocess.run(
                [c, "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable)); "
                          "print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=30, check=True).stdout.split()
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        real = os.path.realpath(base)
        if v in {f"3.{m}" for m in range(10, 14)} and real not in found.values():
            found[f"python{v}-{'system' if real.startswith('/usr/') else Path(real).parent.parent.name}"] = real
    return sorted(found.items())


@pytest.fixture(scope="module", params=interpreters(), ids=lambda p: p[0])
def fake_venv(request, tmp_path_factory):
    base = tmp_path_factory.mktemp("venv")
    venv, extra, elsewhere, program = base / "venv", base / "extra", base / "elsewhere", base / "program"
    subprocess.run([request.param[1], "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3.*/site-packages"))
    extra.mkdir()
    elsewhere.mkdir()
    program.mkdir()
    (program / "__main__.py").write_text("")
    make_fake_packages(site, extra, elsewhere)
    return venv, program, {"PYTHONPATH": str(elsewhere)}


# ---- the package scan: Go vs Python -----------------------------------------------------------

def test_project_venv_go_scan_equals_python(langhost):
    go = answers(langhost, "go", REPO, VENV)
    py = answers(langhost, "python", REPO, VENV)
    assert go == py
    assert not any(isinstance(v, tuple) for v in go.values()), go  # no errors
    names = {n.lower() for n, _ in go["dependencies"]}
    assert {"pulumi", "pydantic", "paramiko"} <= names, names


def test_fake_packages_go_scan_equals_python(langhost, fake_venv):
    venv, program, env = fake_venv
    go = answers(langhost, "go", program, venv, env)
    py = answers(langhost, "python", program, venv, env)
    auto = answers(langhost, "auto", program, venv, env)
    assert go == py == auto
    assert set(go["plugins"]) == EXPECTED_PLUGINS, go["plugins"]
    assert len(go["plugins"]) == len(EXPECTED_PLUGINS)  # the duplicate is reported once
    params = [p for p in go["packages"] if p[4] is not None]
    assert params == [("resource", "terraform-provider", "0.10.0", "", ("aws-tf", "5.1.0", b"parameter"))]
    deps = {n for n, _ in go["dependencies"]}
    assert {"pulumi_fakeone", "eggy", "nofiles", "pulumi_extra", "pulumi_viapath", "Param-Pkg", "filey"} <= deps, deps


def test_python_errors_are_kept(langhost, tmp_path):
    """Where the Python script fails (here: a nameless plugin in a distribution without metadata),
    the default mode gives the same error, by asking Python."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3.*/site-packages"))
    (site / "broken-1.0.dist-info").mkdir()
    (site / "broken-1.0.dist-info" / "RECORD").write_text("broken/pulumi-plugin.json,,\n")
    (site / "broken").mkdir()
    (site / "broken" / "pulumi-plugin.json").write_text(plugin(resource=True))
    auto = answers(langhost, "auto", tmp_path, venv)
    py = answers(langhost, "python", tmp_path, venv)
    assert auto == py
    assert auto["plugins"][0] == "error" and "AttributeError" in auto["plugins"][1]


def test_unmodelled_pth_code_falls_back_to_python(langhost, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3.*/site-packages"))
    hidden = tmp_path / "hidden"
    dist_info(hidden, "pulumi_hidden-1.0.0.dist-info", "pulumi_hidden", "1.0.0", ["pulumi_hidden/pulumi-plugin.json,,"],
              {"pulumi_hidden/pulumi-plugin.json": plugin(resource=True)})
    # Code that changes sys.path: only Python knows what it does.
    (site / "custom.pth").write_text(f"import sys; sys.path.append({str(hidden)!r})\n")
    py = answers(langhost, "python", tmp_path, venv)
    auto = answers(langhost, "auto", tmp_path, venv)
    assert auto == py
    assert ("resource", "hidden", "1.0.0", "") in py["plugins"]
    go = answers(langhost, "go", tmp_path, venv)
    assert go["plugins"][0] == "error" and "does not model" in go["plugins"][1] and "custom.pth" in go["plugins"][1]


def test_missing_virtualenv_same_error(langhost, tmp_path):
    missing = tmp_path / "no-such-venv"
    auto = answers(langhost, "auto", tmp_path, missing)
    py = answers(langhost, "python", tmp_path, missing)
    assert auto == py
    for kind, detail in auto.values():
        assert kind == "error" and f"the virtualenv {missing}" in detail and "has no bin/python" in detail


def test_about_version_is_the_interpreters(langhost, tmp_path):
    want = subprocess.run([str(VENV / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    cache_home = tmp_path / "cache"
    info = program_info(REPO, VENV)
    for _ in range(2):  # the second answer comes from the cache
        with host(langhost, "auto", {"XDG_CACHE_HOME": str(cache_home)}) as stub:
            about = stub.About(language_pb2.AboutRequest(info=info))
        assert about.version == want
        assert about.executable == str(VENV / "bin" / "python")
        assert about.metadata["packageScan"] == "go"
    cached = json.loads(next(cache_home.rglob("python-versions.json")).read_text())
    assert list(cached.values()) == [want]


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
        assert time.monotonic() - started < 5  # stopped waiting for the 30 s thread


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
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what the engine does when it closes the plugin
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - started < 2
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
