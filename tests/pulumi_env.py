"""The offline Pulumi engine environment for Python callers (tests, Automation API).

The settings are not restated here: `engine_env()` sources scripts/env.sh in bash and returns the
environment it produces, so the shell and the tests always agree. Versions come from
scripts/versions.env (`versions()`).

    from tests.pulumi_env import engine_env, pulumi_command
    env = engine_env(pulumi_home=tmp / "home", backend_url=f"file://{tmp / 'state'}")
    ws = auto.LocalWorkspaceOptions(pulumi_command=pulumi_command(env), env_vars=env, ...)
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV_SH = REPO / "scripts" / "env.sh"
VERSIONS_ENV = REPO / "scripts" / "versions.env"
BOOTSTRAP = REPO / "scripts" / "bootstrap-pulumi"

# What the bin dir must hold for a Python program with dynamic providers to run.
REQUIRED_BINARIES = (
    "pulumi",
    "pulumi-language-python",
    "pulumi-language-python-exec",
    "pulumi-resource-pulumi-python",
)


class EngineMissing(RuntimeError):
    """The cached engine has not been built on this machine."""


def versions() -> dict[str, str]:
    """KEY=VALUE pairs of scripts/versions.env (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in VERSIONS_ENV.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip("'\"")
    return out


def engine_env(
    *,
    pulumi_home: str | os.PathLike[str] | None = None,
    backend_url: str | None = None,
    passphrase: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The full process environment after `source scripts/env.sh`.

    pulumi_home / backend_url / passphrase, when given, are set before sourcing, so env.sh keeps
    them (it only fills in defaults). `base` replaces os.environ as the starting point.
    """
    start = dict(os.environ if base is None else base)
    if pulumi_home is not None:
        Path(pulumi_home).mkdir(parents=True, exist_ok=True)
        start["PULUMI_HOME"] = str(pulumi_home)
    if backend_url is not None:
        start["PULUMI_BACKEND_URL"] = backend_url
    if passphrase is not None:
        start["PULUMI_CONFIG_PASSPHRASE"] = passphrase
        start.pop("PULUMI_CONFIG_PASSPHRASE_FILE", None)
    out = subprocess.run(
        ["bash", "-c", 'source "$1" 2>/dev/null && env -0', "env.sh", str(ENV_SH)],
        env=start,
        check=True,
        capture_output=True,
    ).stdout
    env: dict[str, str] = {}
    for item in out.split(b"\0"):
        if item:
            key, _, value = item.decode().partition("=")
            env[key] = value
    return env


def bin_dir(env: Mapping[str, str] | None = None) -> Path:
    """The cached engine bin dir (GPU_SERVING_PULUMI_BIN)."""
    return Path((env or engine_env())["GPU_SERVING_PULUMI_BIN"])


def pulumi_root(env: Mapping[str, str] | None = None) -> Path:
    """The directory to pass as PulumiCommand(root=...): the parent of the bin dir."""
    return Path((env or engine_env())["GPU_SERVING_PULUMI_ROOT"])


def missing_binaries(env: Mapping[str, str] | None = None) -> list[str]:
    d = bin_dir(env)
    return [name for name in REQUIRED_BINARIES if not os.access(d / name, os.X_OK)]


def require_engine(env: Mapping[str, str] | None = None) -> Path:
    """The bin dir, or EngineMissing with the command that builds it."""
    env = env or engine_env()
    missing = missing_binaries(env)
    if missing:
        raise EngineMissing(
            f"the offline Pulumi engine is not built: {', '.join(missing)} missing in {bin_dir(env)}. "
            f"Run {BOOTSTRAP.relative_to(REPO)} (or scripts/setup) first; "
            f"a cold build takes several minutes and is cached."
        )
    return bin_dir(env)


def pulumi_command(env: Mapping[str, str] | None = None):
    """An Automation API PulumiCommand for the cached engine (validates `pulumi version`)."""
    from pulumi import automation as auto

    env = env or engine_env()
    require_engine(env)
    return auto.PulumiCommand(root=str(pulumi_root(env)))


def settings_only_stack_files(project: Path) -> None:
    """In a copy of the project: keep only `config` in each Pulumi.<stack>.yaml. A stack file the
    developer's own runs salted (`encryptionsalt`) belongs to their backend and passphrase, not to
    the copy's, whose `stack select --create` would then fail with "incorrect passphrase"."""
    import yaml

    for stack_file in Path(project).glob("Pulumi.*.yaml"):
        doc = yaml.safe_load(stack_file.read_text()) or {}
        stack_file.write_text(yaml.safe_dump({"config": doc.get("config") or {}}, sort_keys=False))


def committed_stack_files(project: Path) -> list[str]:
    """In a copy of the checkout: each Pulumi.<stack>.yaml as a clone of it gets it, i.e. as git's
    index holds it (what the next commit holds), and none that git does not track. A developer's
    own runs write an `encryptionsalt` into the working copy (their passphrase's); a clone never
    has it unless it was committed, which is what a test of the team flow must see. Outside a git
    checkout the files stay as copied. Returns the stack names."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", "Pulumi.*.yaml"], capture_output=True, timeout=60)
    if listed.returncode != 0:
        return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in Path(project).glob("Pulumi.*.yaml"))
    tracked = [name for name in listed.stdout.decode().split("\0") if name and "/" not in name]
    for stack_file in Path(project).glob("Pulumi.*.yaml"):
        if stack_file.name not in tracked:
            stack_file.unlink()
    for name in tracked:
        shown = subprocess.run(["git", "-C", str(REPO), "show", f":{name}"], capture_output=True, check=True, timeout=60)
        (Path(project) / name).write_bytes(shown.stdout)
    return sorted(name[len("Pulumi."):-len(".yaml")] for name in tracked)


@contextmanager
def provider_process(cwd: Path) -> Iterator[object]:
    """The dynamic-provider launcher (scripts/pulumi-build/language-python) started as the engine
    starts it, with the project's venv, in `cwd` (the project whose modules it loads): a stub of
    its gRPC server. The process group is killed afterwards."""
    import grpc
    from pulumi.runtime.proto import provider_pb2_grpc

    launcher = REPO / "scripts" / "pulumi-build" / "language-python" / "pulumi-resource-pulumi-python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["PULUMI_RUNTIME_VIRTUALENV"] = str(REPO / ".venv")
    proc = subprocess.Popen([str(launcher), "127.0.0.1:1"], stdout=subprocess.PIPE, env=env, cwd=cwd,
                            start_new_session=True, text=True)
    try:
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield provider_pb2_grpc.ResourceProviderStub(channel)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
