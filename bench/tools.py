"""The four tools, each driven the way its users run it, on a list of rehearsal hosts.

Every tool has ``converge(stack, hosts)`` (its normal apply, which ends when the server answers
/health_generate) and ``check(stack, hosts)`` (its drift check; returns True when it reports
drift). Both raise `ToolFailed` with the tool's output when it fails.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from .hosts import Host
from .workspace import BENCH, Project

PEERS = BENCH / "peers"


def use_peers(directory: Path) -> None:
    """Run the peers from a copy (edits to bench/peers during a run do not reach it)."""
    global PEERS
    if directory.exists():
        shutil.rmtree(directory)
    shutil.copytree(BENCH / "peers", directory)
    PEERS = directory


class ToolFailed(RuntimeError):
    pass


def _run(argv: list[str], *, cwd: Optional[Path] = None, env: Optional[dict] = None, timeout: float = 900,
         ok=(0,)) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout)
    if proc.returncode not in ok:
        raise ToolFailed(f"{' '.join(argv[:4])} ... exited {proc.returncode}:\n{excerpt(proc.stdout)}")
    return proc


def excerpt(output: str, tail: int = 25) -> str:
    """What a failed tool said: its error lines, then its last lines."""
    lines = output.strip().splitlines()
    errors = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower() or "failed" in ln.lower()][:30]
    return "\n".join(errors + ["..."] + lines[-tail:])


def _parallel(procs: list[tuple[list[str], dict]], timeout: float = 900) -> list[subprocess.CompletedProcess]:
    """Start every command at once, wait for all: one Pulumi stack per host, in parallel."""
    running = [(argv, subprocess.Popen(argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw))
               for argv, kw in procs]
    out = []
    for argv, p in running:
        stdout, _ = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(argv, p.returncode, stdout))
    return out


class Tool:
    name = "?"
    scenarios: tuple[str, ...] = ("noop", "drift", "switch")

    def converge(self, stack: str, hosts: list[Host]) -> None:
        raise NotImplementedError

    def check(self, stack: str, hosts: list[Host]) -> bool:
        raise NotImplementedError

    def after_run(self) -> None:
        """Close what a run left open (Ansible's ControlPersist masters)."""


# ---------------------------------------------------------------------------------------------
class GpuServing(Tool):
    """`pulumi up --stack S --yes` (Pulumi.yaml's `refresh: always`, as shipped) and `pulumi preview
    --stack S --refresh --expect-no-changes`. One host: that host's stack. A fleet: one stack
    listing every host (gpu-serving:hosts), one engine run; or, given no fleet projects (the
    program before fleets existed), one stack per host, run in parallel."""

    name = "gpu-serving"

    def __init__(self, projects: dict[str, Project], up_args: tuple[str, ...] = (),
                 fleets: dict[tuple[str, ...], Project] | None = None):
        self.projects = projects
        self.up_args = up_args
        self.fleets = fleets or {}

    def _each(self, hosts: list[Host], args: list[str], ok=(0,)) -> list[subprocess.CompletedProcess]:
        fleet = self.fleets.get(tuple(h.name for h in hosts)) if len(hosts) > 1 else None
        if fleet is not None:
            r = _run(["pulumi", *args], cwd=fleet.dir, env=fleet.env, ok=(0, 255))
            if r.returncode not in ok:
                raise ToolFailed(f"gpu-serving on {fleet.host}: pulumi {' '.join(args)} exited {r.returncode}:\n{excerpt(r.stdout)}")
            return [r]
        procs = [(["pulumi", *args], {"cwd": self.projects[h.name].dir, "env": self.projects[h.name].env}) for h in hosts]
        results = _parallel(procs)
        for h, r in zip(hosts, results):
            if r.returncode not in ok:
                raise ToolFailed(f"gpu-serving on {h.name}: pulumi {' '.join(args)} exited {r.returncode}:\n{excerpt(r.stdout)}")
        return results

    def converge(self, stack, hosts):
        self._each(hosts, self.args("converge", stack))

    def args(self, what: str, stack: str) -> list[str]:
        return (["up", "--stack", stack, "--yes", *self.up_args] if what == "converge"
                else ["preview", "--stack", stack, "--refresh", "--expect-no-changes"])

    def check(self, stack, hosts):
        results = self._each(hosts, self.args("check", stack), ok=(0, 255))
        # 255 with "no changes were expected" is drift; any other error is a failure
        for r in results:
            if r.returncode and "no changes were expected" not in r.stdout.lower():
                raise ToolFailed(f"gpu-serving drift check failed:\n{r.stdout[-3000:]}")
        return any(r.returncode for r in results)


class _GpuServingVariant(GpuServing):
    """gpu-serving's own projects and stacks, every command run with `extra_env` added."""

    extra_env: dict[str, str] = {}

    def __init__(self, projects: dict[str, Project], up_args: tuple[str, ...] = (),
                 fleets: dict[tuple[str, ...], Project] | None = None):
        def vary(p: Project) -> Project:
            return dataclasses.replace(p, env={**p.env, **self.extra_env})

        super().__init__({k: vary(p) for k, p in projects.items()}, up_args,
                         {k: vary(p) for k, p in (fleets or {}).items()})


class GpuServingCold(_GpuServingVariant):
    """gpu-serving with GPU_SERVING_WARM_START=0: every program and provider process starts its
    own Python and imports everything (docs/performance-internals.md, "Warm start"), as before the warm process. The
    same projects and stacks as `gpu-serving`: the two side by side measure what warm start saves."""

    name = "gpu-serving-cold"
    extra_env = {"GPU_SERVING_WARM_START": "0"}


class GpuServingNoCheckpoints(_GpuServingVariant):
    """A measurement, not a way to run: gpu-serving with PULUMI_SKIP_CHECKPOINTS=true, so the
    engine writes the state once at the end instead of after every step (the file backend
    writes the whole state each time: with `refresh: always` under PULUMI_RUN_PROGRAM every
    resource's refresh writes it in the update, and each update step twice). The difference to
    `gpu-serving` in the same run is what the state's writes cost. A run killed half way would
    leave the state as it was before the run, which is why gpu-serving never sets it."""

    name = "gpu-serving-no-checkpoints"
    extra_env = {"PULUMI_SKIP_CHECKPOINTS": "true"}


def traced(project: Project, args: list[str]) -> tuple[float, float, str]:
    """(start, end, the engine's log) of `pulumi ARGS -v=9 --logtostderr --logflow`: the log
    bench/trace.py splits into phases. Not a timed run (the log costs time itself)."""
    started = time.time()
    # The SDK's debug line "Waiting for outstanding RPCs to complete" marks the end of the
    # program's __main__ (bench/trace.py): gpu-serving makes its SDK's debug lines only when asked
    # (components/pulumi_sdk.py), so a traced run asks, and its program phases include their cost.
    env = {**project.env, "GPU_SERVING_SDK_DEBUG": "1"}
    proc = subprocess.run(["pulumi", *args, "-v=9", "--logtostderr", "--logflow"], cwd=project.dir, env=env,
                          text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    ended = time.time()
    if proc.returncode:
        raise ToolFailed(f"pulumi {' '.join(args)} (traced) exited {proc.returncode}:\n{excerpt(proc.stderr)}")
    return started, ended, proc.stderr


class EmptyPulumi(Tool):
    """The floor of every Pulumi command: the same commands as gpu-serving's (`pulumi up --yes`,
    `pulumi preview --refresh --expect-no-changes`) on a program that declares nothing, with the
    same CLI, language host, venv and `refresh: always`. It touches no host."""

    name = "empty-pulumi"
    scenarios = ("noop", "drift")

    def __init__(self, project: Project):
        self.project = project

    def args(self, what: str) -> list[str]:
        return (["up", "--stack", "floor", "--yes"] if what == "converge"
                else ["preview", "--stack", "floor", "--refresh", "--expect-no-changes"])

    def converge(self, stack, hosts):
        _run(["pulumi", *self.args("converge")], cwd=self.project.dir, env=self.project.env)

    def check(self, stack, hosts):
        r = _run(["pulumi", *self.args("check")], cwd=self.project.dir, env=self.project.env, ok=(0, 255))
        return bool(r.returncode)


# ---------------------------------------------------------------------------------------------
# What a peer needs of gpu-serving's plan to write the same files and serve the same unit.
PEER_PLAN_KEYS = ("unit_name", "unit_text", "environment_path", "environment_text", "port", "siblings")


def _hosts_key(hosts: list[Host]) -> str:
    return "-".join(h.name for h in hosts)


class Ansible(Tool):
    """`ansible-playbook serving.yml` and `ansible-playbook --check --diff serving.yml`, with
    pipelining and ControlPersist on. Each run starts cold (its own ControlPath directory, the
    masters closed after it), as a user's next `ansible-playbook` a while later would."""

    name = "ansible"

    def __init__(self, venv: Path, work: Path, plans: dict[str, dict]):
        self.bin = venv / "bin"
        self.dir = work / "ansible"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.control = None
        for stack, plan in plans.items():
            (self.dir / f"vars-{stack}.json").write_text(json.dumps({k: plan[k] for k in PEER_PLAN_KEYS}))
        (self.dir / "ansible.cfg").write_text(
            "[defaults]\n"
            "host_key_checking = True\n"
            "forks = 16\n"
            "interpreter_python = /usr/bin/python3\n"
            "retry_files_enabled = False\n"
            f"local_tmp = {self.dir}/tmp\n"
            "[ssh_connection]\n"
            "pipelining = True\n"
            "ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o IdentitiesOnly=yes -o BatchMode=yes\n")

    def _inventory(self, hosts: list[Host]) -> Path:
        path = self.dir / f"inventory-{_hosts_key(hosts)}.ini"
        lines = ["[gpu]"]
        for h in hosts:
            i = h.info
            lines.append(f"{h.name} ansible_host={i.address} ansible_port={i.port} ansible_user={i.user} "
                         f"ansible_ssh_private_key_file={i.private_key} "
                         f"ansible_ssh_common_args='-o UserKnownHostsFile={i.known_hosts} -o GlobalKnownHostsFile=/dev/null "
                         f"-o StrictHostKeyChecking=yes'")
        path.write_text("\n".join(lines) + "\n")
        return path

    def _env(self) -> dict:
        self.control = Path(tempfile.mkdtemp(prefix="cp-", dir=self.dir))
        return {**os.environ, "ANSIBLE_CONFIG": str(self.dir / "ansible.cfg"), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control),
                "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "LC_ALL": "C.UTF-8", "PATH": f"{self.bin}:{os.environ['PATH']}"}

    def _playbook(self, stack, hosts, *extra) -> subprocess.CompletedProcess:
        return _run([str(self.bin / "ansible-playbook"), "-i", str(self._inventory(hosts)), "-e", f"@{self.dir / f'vars-{stack}.json'}",
                     *extra, str(PEERS / "ansible" / "serving.yml")], cwd=PEERS / "ansible", env=self._env())

    def converge(self, stack, hosts):
        self._playbook(stack, hosts)

    def check(self, stack, hosts):
        out = self._playbook(stack, hosts, "--check", "--diff").stdout
        recap = re.findall(r"changed=(\d+).*?failed=(\d+)", out)
        if len(recap) != len(hosts):
            raise ToolFailed(f"ansible --check printed no recap for every host:\n{out[-3000:]}")
        return any(int(c) or int(f) for c, f in recap)

    def after_run(self):
        if self.control and self.control.exists():
            for sock in self.control.iterdir():
                subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "bench"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30)
            shutil.rmtree(self.control, ignore_errors=True)
            self.control = None


# ---------------------------------------------------------------------------------------------
class Pyinfra(Tool):
    """`pyinfra -y inventory.py deploy.py` and `pyinfra --dry inventory.py deploy.py`."""

    name = "pyinfra"

    def __init__(self, venv: Path, work: Path, plans: dict[str, dict]):
        self.bin = venv / "bin"
        self.dir = work / "pyinfra"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.plans = plans

    def _inventory(self, stack: str, hosts: list[Host]) -> Path:
        path = self.dir / f"inventory_{stack}_{_hosts_key(hosts).replace('-', '_')}.py"
        plan = {k: self.plans[stack][k] for k in PEER_PLAN_KEYS}
        entries = []
        for h in hosts:
            i = h.info
            entries.append((h.name, {"ssh_hostname": i.address, "ssh_port": i.port, "ssh_user": i.user, "ssh_key": i.private_key,
                                     "ssh_known_hosts_file": i.known_hosts, "ssh_strict_host_key_checking": "yes",
                                     "ssh_connect_retries": 0, **plan}))
        path.write_text(f"gpu = {entries!r}\n")
        return path

    def _pyinfra(self, stack, hosts, *extra) -> subprocess.CompletedProcess:
        env = {**os.environ, "LC_ALL": "C.UTF-8", "PYINFRA_PROGRESS": "off", "PATH": f"{self.bin}:{os.environ['PATH']}"}
        return _run([str(self.bin / "pyinfra"), *extra, str(self._inventory(stack, hosts)), str(PEERS / "pyinfra" / "deploy.py")],
                    cwd=self.dir, env=env, ok=(0, 1))

    def converge(self, stack, hosts):
        r = self._pyinfra(stack, hosts, "-y")
        if r.returncode:
            raise ToolFailed(f"pyinfra exited {r.returncode}:\n{excerpt(r.stdout)}")

    def check(self, stack, hosts):
        r = self._pyinfra(stack, hosts, "--dry", "--data", "drift_check=true")
        if "DRIFT " in r.stdout:
            return True
        if r.returncode:
            raise ToolFailed(f"pyinfra --dry exited {r.returncode}:\n{r.stdout[-3000:]}")
        return pyinfra_changes(r.stdout) > 0


def pyinfra_changes(output: str) -> int:
    """Operations pyinfra's --dry would execute, from its "Detected changes" table."""
    changes = 0
    section = output.split("--> Detected changes:", 1)[-1]
    for line in section.splitlines():
        # "    bench0   1 change   0 no change ..." (pyinfra 3) / "Operation ... (1 change)"
        m = re.search(r"(\d+)\s+change\b", line)
        if m and "no change" not in line[: m.start()]:
            changes += int(m.group(1))
    return changes


# ---------------------------------------------------------------------------------------------
class RawSsh(Tool):
    """bench/peers/raw/serving.sh: one ssh connection per host per run."""

    name = "raw-ssh"

    def __init__(self, work: Path, plans: dict[str, dict]):
        self.dir = work / "raw"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.plans = plans
        for stack, plan in plans.items():
            (self.dir / f"{stack}.unit").write_text(plan["unit_text"])
            (self.dir / f"{stack}.env").write_text(plan["environment_text"])

    def _script(self, mode, stack, hosts, ok=(0,)):
        path = self.dir / f"hosts-{_hosts_key(hosts)}"
        path.write_text("".join(f"{h.info.user}@{h.info.address} {h.info.private_key} {h.info.known_hosts}\n" for h in hosts))
        p = self.plans[stack]
        return _run(["bash", str(PEERS / "raw" / "serving.sh"), mode, str(path), p["unit_name"], str(self.dir / f"{stack}.unit"),
                     p["environment_path"], str(self.dir / f"{stack}.env"), str(p["port"]), *p["siblings"]], ok=ok)

    def converge(self, stack, hosts):
        self._script("converge", stack, hosts)

    def check(self, stack, hosts):
        return self._script("check", stack, hosts, ok=(0, 1)).returncode == 1
