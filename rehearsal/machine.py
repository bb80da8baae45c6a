"""A rehearsal host's lifecycle: a real Debian bookworm host (systemd as PID 1, OpenSSH) booted
locally with systemd-nspawn, on an overlay of the base rootfs (rootfs.py), in its own network
namespace (network.py). Instance configuration and keys, the overlay and the files each boot
writes, the nspawn process and its container, readiness, and up/stop/restart/down/status.
State layout: common.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from .common import (RehearsalError, ensure_inotify_room, flock, global_lock, instance_dir,
                     instances_root, log, mounts_under, require_root, require_tools, run, run_root, safe_rmtree,
                     state_dir, umount_all_under, write_file)
from .network import (MAX_INDEX, SUBNET_PREFIX, isolate_range, netns_name, network_down,
                      network_up, port_open, subnet, veth_name)
from .checkpoint import INDEX, standin
from .rootfs import GUEST_GPU_DIR, GUEST_PROFILE, ensure_rootfs

PACKAGE_DIR = Path(__file__).resolve().parent
GPU_DIR = PACKAGE_DIR / "gpu"
GPU_SCRIPT = GPU_DIR / "nvidia_smi.py"
PROFILES_DIR = GPU_DIR / "profiles"
MODELS_DIR = PACKAGE_DIR / "models"

DEFAULT_NAME = "default"
DEFAULT_PROFILE = "rtx-pro-6000-8"
DEFAULT_MODEL = "kimi-k2.6"

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,10}$")  # veth "gsr-<name>" must fit 15 chars
SSH_USER = "root"
SSH_PORT = 22


def validate_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise RehearsalError(
            f"invalid rehearsal host name {name!r}: use 1-11 characters a-z, 0-9, '-', "
            "starting with a letter (it names the network namespace and the veth "
            f"'gsr-<name>', which Linux limits to 15 characters), e.g. 'default', 'h1'")
    return name


def _instance_lock(name: str):
    return flock(run_root() / ".locks" / f"{name}.lock")


# --------------------------------------------------------------------------------------
# Instance configuration


@dataclasses.dataclass
class InstanceConfig:
    name: str
    index: int
    profile: Optional[str]
    profile_path: Optional[str]
    model: Optional[str]
    model_source: Optional[str]
    rootfs: str

    @classmethod
    def load(cls, name: str) -> Optional["InstanceConfig"]:
        path = instance_dir(name) / "instance.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    def save(self) -> None:
        write_file(instance_dir(self.name) / "instance.json",
                    json.dumps(dataclasses.asdict(self), indent=2) + "\n", 0o600)


def _is_path(ref: str) -> bool:
    return "/" in ref or ref.endswith(".json") or ref.startswith(".")


def _resolve_profile(profile: str) -> Path:
    p = Path(profile)
    if _is_path(profile):
        path = p.resolve()
    else:
        path = PROFILES_DIR / f"{profile}.json"
    if not path.is_file():
        known = sorted(x.stem for x in PROFILES_DIR.glob("*.json"))
        raise RehearsalError(f"GPU profile {profile!r} not found ({path}); known profiles: "
                             f"{', '.join(known) or 'none yet'}")
    return path


def _resolve_model(model: str) -> Path:
    p = Path(model)
    path = p.resolve() if _is_path(model) else MODELS_DIR / model
    if not path.is_dir():
        known = sorted(x.name for x in MODELS_DIR.iterdir() if x.is_dir()) \
            if MODELS_DIR.is_dir() else []
        raise RehearsalError(f"model stand-in {model!r} not found ({path}); known models: "
                             f"{', '.join(known) or 'none yet'}")
    return path


def _used_indexes(except_name: str) -> dict[int, str]:
    used = {}
    if instances_root().is_dir():
        for d in instances_root().iterdir():
            if d.name == except_name:
                continue
            cfg = InstanceConfig.load(d.name)
            if cfg is not None:
                used[cfg.index] = d.name
    return used


def _keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_suffix(".pub").exists():
        return
    for p in (path, Path(f"{path}.pub")):
        if p.exists():
            p.unlink()
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    os.chmod(path, 0o600)


def _ensure_instance(name: str, profile: Optional[str], model: Optional[str],
                     index: Optional[int], rootfs: Path) -> InstanceConfig:
    """Create (or check) the persistent instance config, keys and overlay dirs."""
    idir = instance_dir(name)
    cfg = InstanceConfig.load(name)
    if cfg is not None:
        for what, asked, have in (("profile", profile, cfg.profile), ("model", model, cfg.model),
                                  ("index", index, cfg.index)):
            if asked is not None and asked != have:
                raise RehearsalError(
                    f"rehearsal host {name!r} exists with {what}={have!r}, not {asked!r}: "
                    f"run `python -m rehearsal down {name}` first, or omit --{what}")
        if not Path(cfg.rootfs).is_dir():
            raise RehearsalError(
                f"rehearsal host {name!r} was made on rootfs {cfg.rootfs}, which is gone: "
                f"run `python -m rehearsal down {name}` and up again")
    else:
        profile = DEFAULT_PROFILE if profile is None else profile
        model = DEFAULT_MODEL if model is None else model
        profile_path = str(_resolve_profile(profile)) if profile else None
        if profile and _is_path(profile):
            profile = profile_path  # a path is kept absolute; a name is resolved every boot
        model_source = str(_resolve_model(model)) if model else None
        if model and _is_path(model):
            model = Path(model_source).name
        with global_lock():
            used = _used_indexes(name)
            if index is None:
                index = next((i for i in range(MAX_INDEX + 1) if i not in used), None)
                if index is None:
                    raise RehearsalError("no free rehearsal host index (0..254)")
            elif not 0 <= index <= MAX_INDEX:
                raise RehearsalError(f"index {index} out of range 0..{MAX_INDEX}")
            elif index in used:
                raise RehearsalError(f"index {index} (subnet {SUBNET_PREFIX}.{index}.0/24) is "
                                     f"used by rehearsal host {used[index]!r}; pick another "
                                     "or omit it")
            idir.mkdir(parents=True, exist_ok=True)
            os.chmod(idir, 0o700)
            cfg = InstanceConfig(name=name, index=index, profile=profile,
                                 profile_path=profile_path, model=model,
                                 model_source=model_source, rootfs=str(rootfs))
            cfg.save()
    for sub in ("upper", "work", "merged"):
        (idir / sub).mkdir(exist_ok=True)
    _keygen(idir / "id_ed25519", f"gpu-serving-rehearsal-{name}")
    _keygen(idir / "ssh_host_ed25519_key", f"root@{name}")
    # Names are resolved in this checkout every boot (the repository may have moved, e.g. a
    # CI clone); a model given as a path keeps its recorded directory.
    if cfg.profile:
        cfg.profile_path = str(_resolve_profile(cfg.profile))
    if cfg.model:
        by_name = MODELS_DIR / cfg.model
        cfg.model_source = str(_resolve_model(
            str(by_name) if by_name.is_dir() or not cfg.model_source else cfg.model_source))
    return cfg


def _host_public_key(name: str) -> str:
    text = (instance_dir(name) / "ssh_host_ed25519_key.pub").read_text().split()
    return f"{text[0]} {text[1]}"


# --------------------------------------------------------------------------------------
# Overlay and provisioning


def _mount_overlay(cfg: InstanceConfig) -> Path:
    idir = instance_dir(cfg.name)
    merged = idir / "merged"
    umount_all_under(merged)  # stale from a crash: start clean
    # A crashed overlay may leave its work dir busy; clear it (it holds no state).
    work = idir / "work"
    if work.exists():
        safe_rmtree(work)
    work.mkdir()
    opts = f"lowerdir={cfg.rootfs},upperdir={idir / 'upper'},workdir={work}"
    run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)])
    return merged


def _provision(cfg: InstanceConfig, merged: Path) -> None:
    """Files each boot needs in the instance (written into its overlay upper dir)."""
    idir = instance_dir(cfg.name)
    ssh_dir = merged / "etc/ssh"
    for suffix, mode in (("", 0o600), (".pub", 0o644)):
        src = idir / f"ssh_host_ed25519_key{suffix}"
        write_file(ssh_dir / f"ssh_host_ed25519_key{suffix}", src.read_bytes(), mode)
    root_ssh = merged / "root/.ssh"
    root_ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root_ssh, 0o700)
    auth = root_ssh / "authorized_keys"
    pub = (idir / "id_ed25519.pub").read_text().strip()
    existing = auth.read_text() if auth.exists() else ""
    if pub not in existing.splitlines():
        if existing and not existing.endswith("\n"):
            existing += "\n"
        write_file(auth, existing + pub + "\n", 0o600)
    write_file(merged / "etc/hostname", cfg.name + "\n")
    profile = merged / GUEST_PROFILE.lstrip("/")
    if profile.exists() or profile.is_symlink():
        profile.unlink()
    link = _guest_profile_link(cfg)
    if link:
        profile.parent.mkdir(parents=True, exist_ok=True)
        profile.symlink_to(link)


def _guest_profile_link(cfg: InstanceConfig) -> Optional[str]:
    """Where /etc/rehearsal/gpu-profile.json points when the profile is one of the repo's."""
    if not cfg.profile_path or not GPU_SCRIPT.is_file():
        return None
    path = Path(cfg.profile_path)
    if path.parent != PROFILES_DIR:
        return None
    return f"{GUEST_GPU_DIR}/profiles/{path.name}"


# --------------------------------------------------------------------------------------
# Processes


def _proc_state(pid: int) -> Optional[str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: Optional[int]) -> bool:
    return bool(pid) and _proc_state(pid) not in (None, "Z", "X")


def _is_our_nspawn(pid: int, name: str) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (any(a.endswith(b"systemd-nspawn") for a in argv[:1])
            and f"--machine={name}".encode() in argv)


def _read_pid(name: str) -> Optional[int]:
    try:
        pid = int((state_dir(name) / "nspawn.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    if _alive(pid) and _is_our_nspawn(pid, name):
        return pid
    return None


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _leader_pid(nspawn_pid: int) -> Optional[int]:
    """The container's PID 1 as seen from the host (the child of nspawn in a new PID ns)."""
    try:
        own = os.readlink(f"/proc/{nspawn_pid}/ns/pid")
    except OSError:
        return None
    for child in _children(nspawn_pid):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{child}/ns/pid") != own:
                return child
    return None


def pids_in_pidns(pidns: str) -> list[int]:
    """Host PIDs of processes in the PID namespace `pidns` (e.g. 'pid:[4026532...]')."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(d / "ns/pid") == pidns and _alive(int(d.name)):
                    out.append(int(d.name))
    return out


def container_pids(name: str) -> list[int]:
    """Host PIDs of processes still using the instance's overlay from another mount namespace
    (a container whose systemd-nspawn was killed keeps running without it)."""
    pat = re.compile(r"upperdir=" + re.escape(str(instance_dir(name) / "upper")) + r"(,|\s|$)")
    own = os.readlink("/proc/self/ns/mnt")
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(d / "ns/mnt") == own or not _alive(int(d.name)):
                continue
            if pat.search((d / "mountinfo").read_text()):
                out.append(int(d.name))
    return out


def _kill_container_pids(name: str) -> None:
    for attempt in range(50):
        pids = container_pids(name)
        if not pids:
            return
        if attempt == 0:
            log(f"{name}: killing {len(pids)} leftover container process(es)")
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.1)
    raise RehearsalError(f"{name}: container processes {container_pids(name)} do not die")


def _spawn_detached(argv: Sequence[str], log_path: Path) -> int:
    """Start argv in its own session, not as our child (double fork); return its PID."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # intermediate child
        try:
            os.close(r)
            os.setsid()
            pid2 = os.fork()
            if pid2 == 0:  # the daemon
                try:
                    null = os.open("/dev/null", os.O_RDONLY)
                    console = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
                    os.dup2(null, 0)
                    os.dup2(console, 1)
                    os.dup2(console, 2)
                    os.closerange(3, 4096)
                    for sig in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                signal.SIGXFSZ):
                        signal.signal(sig, signal.SIG_DFL)
                    signal.pthread_sigmask(signal.SIG_SETMASK, [])
                    os.execvp(argv[0], list(argv))
                finally:
                    os._exit(127)
            os.write(w, str(pid2).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    if not data:
        raise RehearsalError(f"could not start {argv[0]}")
    return int(data)


def _nspawn_argv(cfg: InstanceConfig, merged: Path) -> list[str]:
    argv = ["systemd-nspawn", "--boot", "--register=no", "--keep-unit",
            f"--directory={merged}", f"--machine={cfg.name}",
            f"--network-namespace-path=/run/netns/{netns_name(cfg.name)}",
            "--resolv-conf=off", "--timezone=off", "--link-journal=no",
            "--console=read-only", "--kill-signal=SIGRTMIN+4"]  # SIGTERM -> clean poweroff
    if GPU_SCRIPT.is_file():
        argv.append(f"--bind-ro={GPU_DIR}:{GUEST_GPU_DIR}")
    if cfg.profile_path and _guest_profile_link(cfg) is None:
        argv.append(f"--bind-ro={cfg.profile_path}:{GUEST_PROFILE}")
    if cfg.model_source:
        argv.append(f"--bind-ro={mounted_model(Path(cfg.model_source))}:/models/{cfg.model}")
    return argv


def mounted_model(source: Path) -> Path:
    """What /models/<model> shows: a directory that holds a checkpoint (an index or shards) as it
    is; a model's files without weights (rehearsal/models/<model>) as the small stand-in
    checkpoint made from them (rehearsal/checkpoint.py, cached), since the engine loads shards."""
    if (source / INDEX).is_file() or any(source.glob("*.safetensors")):
        return source
    return standin(str(source))


# --------------------------------------------------------------------------------------
# Info


@dataclasses.dataclass
class HostInfo:
    """What `up`/`status` report (and host.json holds)."""
    name: str
    state: str                      # "running" | "stopped" | "absent"
    index: Optional[int] = None
    address: Optional[str] = None   # the host's address (in its network namespace)
    port: int = SSH_PORT
    user: str = SSH_USER
    private_key: Optional[str] = None
    public_key: Optional[str] = None
    host_public_key: Optional[str] = None   # "ssh-ed25519 AAAA..." (pin this)
    known_hosts: Optional[str] = None
    gateway: Optional[str] = None   # the root-namespace end of the veth
    netns: Optional[str] = None
    veth: Optional[str] = None
    profile: Optional[str] = None
    profile_path: Optional[str] = None
    model: Optional[str] = None
    model_path: Optional[str] = None       # inside the host, e.g. /models/kimi-k2.6
    model_source: Optional[str] = None     # the model's files; mounted there as mounted_model() says
    pid: Optional[int] = None              # systemd-nspawn
    leader_pid: Optional[int] = None       # the container's PID 1 (systemd) on the host
    pidns: Optional[str] = None            # the container's PID namespace, "pid:[...]"
    rootfs: Optional[str] = None
    instance_dir: Optional[str] = None
    state_dir: Optional[str] = None
    console_log: Optional[str] = None
    started_at: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> "HostInfo":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    def ssh_args(self, *, tty: bool = False, connect_timeout: int = 5) -> list[str]:
        """`ssh` argv (without the remote command) with the key and the pinned host key."""
        return ["ssh", "-F", "/dev/null", "-i", str(self.private_key),
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", f"ConnectTimeout={connect_timeout}", "-o", "LogLevel=ERROR",
                "-o", "ServerAliveInterval=15",
                "-p", str(self.port)] + (["-t"] if tty else []) + \
               [f"{self.user}@{self.address}"]

    def run(self, command: str, *, check: bool = False, timeout: Optional[float] = 60,
            input: Optional[bytes | str] = None) -> subprocess.CompletedProcess:
        """Run a shell command on the host over ssh; text stdout/stderr."""
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.run(self.ssh_args() + ["--", command], input=data,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        out = subprocess.CompletedProcess(proc.args, proc.returncode,
                                          proc.stdout.decode(errors="replace"),
                                          proc.stderr.decode(errors="replace"))
        if check and out.returncode != 0:
            raise RehearsalError(f"on {self.name}: {command!r} exited {out.returncode}: "
                                 f"{out.stderr.strip() or out.stdout.strip()}")
        return out

    def put(self, local: str | os.PathLike, remote: str, mode: str = "0644",
            timeout: float = 300) -> None:
        """Copy a local file to the host (over ssh, no scp/sftp needed)."""
        data = Path(local).read_bytes()
        q = _shquote(remote)
        self.run(f"cat > {q}.part && chmod {mode} {q}.part && mv {q}.part {q}", check=True,
                 input=data, timeout=timeout)


def _shquote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _info(name: str, state: str, cfg: Optional[InstanceConfig] = None,
          pid: Optional[int] = None) -> HostInfo:
    cfg = cfg or InstanceConfig.load(name)
    if cfg is None:
        return HostInfo(name=name, state="absent")
    idir, sdir = instance_dir(name), state_dir(name)
    gw, addr = subnet(cfg.index)
    info = HostInfo(
        name=name, state=state, index=cfg.index, address=addr, gateway=gw,
        private_key=str(idir / "id_ed25519"), public_key=str(idir / "id_ed25519.pub"),
        known_hosts=str(sdir / "known_hosts"), netns=netns_name(name), veth=veth_name(name),
        profile=cfg.profile, profile_path=cfg.profile_path, model=cfg.model,
        model_path=f"/models/{cfg.model}" if cfg.model else None,
        model_source=cfg.model_source, rootfs=cfg.rootfs, instance_dir=str(idir),
        state_dir=str(sdir), console_log=str(sdir / "console.log"))
    with contextlib.suppress(OSError, IndexError):
        info.host_public_key = _host_public_key(name)
    if pid:
        info.pid = pid
        info.leader_pid = _leader_pid(pid)
        if info.leader_pid:
            with contextlib.suppress(OSError):
                info.pidns = os.readlink(f"/proc/{info.leader_pid}/ns/pid")
    return info


# --------------------------------------------------------------------------------------
# Readiness


def _console_tail(name: str, lines: int = 30) -> str:
    try:
        text = (state_dir(name) / "console.log").read_text(errors="replace")
    except OSError:
        return "(no console log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_ready(info: HostInfo, pid: int, timeout: float) -> str:
    """Wait until sshd answers and systemd reports running/degraded; return that state."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        if not _alive(pid):
            raise RehearsalError(f"rehearsal host {info.name!r}: systemd-nspawn exited during "
                                 f"boot; console:\n{_console_tail(info.name)}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RehearsalError(
                f"rehearsal host {info.name!r} not ready within {timeout:.0f} s ({last}); "
                f"console:\n{_console_tail(info.name)}")
        if not port_open(info.address, info.port):
            last = "sshd not answering"
            time.sleep(0.2)
            continue
        try:
            proc = info.run("systemctl is-system-running --wait",
                            timeout=max(1.0, min(remaining, 120)))
        except subprocess.TimeoutExpired:
            last = "systemctl is-system-running --wait timed out"
            continue
        state = proc.stdout.strip()
        if state in ("running", "degraded"):
            return state
        last = f"ssh: rc={proc.returncode} {state} {proc.stderr.strip()}"
        time.sleep(0.3)


# --------------------------------------------------------------------------------------
# Lifecycle


def _write_host_json(info: HostInfo) -> None:
    write_file(Path(info.state_dir) / "host.json", info.to_json() + "\n", 0o644)


def _cleanup_stale(name: str, stale: bool = True) -> None:
    """Remove what a stopped or crashed run left: PID file, leftover container processes,
    overlay mount, netns, veth. `stale`: say so when a PID file shows a run that crashed."""
    sdir = state_dir(name)
    pidfile = sdir / "nspawn.pid"
    if pidfile.exists():
        if stale:
            log(f"{name}: cleaning up after a run that did not stop cleanly")
        pidfile.unlink()
    with contextlib.suppress(FileNotFoundError):
        (sdir / "host.json").unlink()
    _kill_container_pids(name)
    merged = instance_dir(name) / "merged"
    if mounts_under(merged):
        umount_all_under(merged)
    network_down(name)


def _stop_container(name: str, pid: int, timeout: float) -> None:
    """Clean poweroff (SIGTERM to nspawn), bounded; then SIGKILL everything of it."""
    leader = _leader_pid(pid)
    pidns = None
    if leader:
        with contextlib.suppress(OSError):
            pidns = os.readlink(f"/proc/{leader}/ns/pid")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        log(f"{name}: no clean poweroff within {timeout:.0f} s; killing")
        if leader and _alive(leader):
            with contextlib.suppress(ProcessLookupError):
                os.kill(leader, signal.SIGKILL)  # PID 1 of the namespace: takes all with it
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    if pidns:
        deadline = time.monotonic() + 10
        while pids_in_pidns(pidns) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in pids_in_pidns(pidns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def _boot(cfg: InstanceConfig, timeout: float) -> HostInfo:
    name = cfg.name
    for change in ensure_inotify_room():
        log(f"raised {change}: every rehearsal host's systemd shares root's inotify budget")
    sdir = state_dir(name)
    sdir.mkdir(parents=True, exist_ok=True)
    os.chmod(sdir, 0o755)
    t0 = time.monotonic()
    pid = None
    try:
        merged = _mount_overlay(cfg)
        _provision(cfg, merged)
        network_up(cfg.name, cfg.index)
        info = _info(name, "starting", cfg)
        write_file(Path(info.known_hosts), f"{info.address} {info.host_public_key}\n")
        pid = _spawn_detached(_nspawn_argv(cfg, merged), sdir / "console.log")
        write_file(sdir / "nspawn.pid", f"{pid}\n")
        _wait_ready(info, pid, timeout)
    except BaseException:
        log(f"{name}: boot failed; stopping it (console log: {sdir / 'console.log'})")
        if pid and _alive(pid):
            _stop_container(name, pid, 15)
        _cleanup_stale(name, stale=False)
        raise
    info = _info(name, "running", cfg, pid)
    info.started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write_host_json(info)
    log(f"{name}: up in {time.monotonic() - t0:.1f} s at {info.address}")
    return info


def up(name: str = DEFAULT_NAME, profile: Optional[str] = None, model: Optional[str] = None,
       index: Optional[int] = None, timeout: float = 120.0) -> HostInfo:
    """Boot the rehearsal host `name` (build the rootfs first if needed) and wait until sshd
    answers and systemd is running. Idempotent: an instance already up is only checked.

    profile: GPU profile name (rehearsal/gpu/profiles/<profile>.json) or a JSON path;
    model: model stand-in name (rehearsal/models/<model>) mounted at /models/<model>;
    index: subnet index (10.213.<index>.0/24), default the lowest free one. For an existing
    instance these default to what it was created with (a different value is an error).
    """
    validate_name(name)
    require_root()
    require_tools()
    isolate_range()
    existing = InstanceConfig.load(name)
    rootfs = Path(existing.rootfs) if existing else ensure_rootfs()
    with _instance_lock(name):
        cfg = _ensure_instance(name, profile, model, index, rootfs)
        pid = _read_pid(name)
        if pid is not None:
            info = _info(name, "running", cfg, pid)
            _wait_ready(info, pid, timeout)
            prev = state_dir(name) / "host.json"
            with contextlib.suppress(OSError, ValueError):
                info.started_at = json.loads(prev.read_text()).get("started_at")
            _write_host_json(info)
            return info
        _cleanup_stale(name)
        return _boot(cfg, timeout)


def _power_off(name: str, timeout: float) -> None:
    """Clean poweroff if it runs, then release mounts and network (stale ones too). Caller holds
    the instance lock."""
    pid = _read_pid(name)
    if pid is not None:
        _stop_container(name, pid, timeout)
    _cleanup_stale(name, stale=pid is None)


def stop(name: str = DEFAULT_NAME, timeout: float = 30.0) -> HostInfo:
    """Power the host off cleanly and release its mounts and network; keep its disk."""
    validate_name(name)
    require_root()
    with _instance_lock(name):
        _power_off(name, timeout)
    return status(name)


def restart(name: str = DEFAULT_NAME, timeout: float = 120.0,
            stop_timeout: float = 30.0) -> HostInfo:
    """Clean poweroff, then boot again on the same persistent disk (like a reboot)."""
    validate_name(name)
    require_root()
    require_tools()
    isolate_range()
    with _instance_lock(name):
        cfg = InstanceConfig.load(name)
        if cfg is None:
            raise RehearsalError(f"no rehearsal host {name!r}: `python -m rehearsal up {name}`")
        cfg = _ensure_instance(name, None, None, None, Path(cfg.rootfs))
        _power_off(name, stop_timeout)
        return _boot(cfg, timeout)


def down(name: str = DEFAULT_NAME, timeout: float = 30.0) -> None:
    """Power the host off and remove it completely (disk, keys, mounts, netns, veth)."""
    validate_name(name)
    require_root()
    with _instance_lock(name):
        _power_off(name, timeout)
        safe_rmtree(instance_dir(name))
        safe_rmtree(state_dir(name))


def status(name: str = DEFAULT_NAME) -> HostInfo:
    """running (with PIDs) / stopped (exists, not booted) / absent."""
    validate_name(name)
    cfg = InstanceConfig.load(name)
    if cfg is None:
        return HostInfo(name=name, state="absent")
    pid = _read_pid(name)
    if pid is None:
        return _info(name, "stopped", cfg)
    info = _info(name, "running", cfg, pid)
    with contextlib.suppress(OSError, ValueError):
        info.started_at = json.loads((state_dir(name) / "host.json").read_text()) \
            .get("started_at")
    return info


def list_hosts() -> list[HostInfo]:
    names = set()
    for root in (instances_root(), run_root()):
        if root.is_dir():
            names |= {d.name for d in root.iterdir() if d.is_dir() and NAME_RE.match(d.name)}
    return [status(n) for n in sorted(names)]


def ssh_argv(name: str, command: Sequence[str] = ()) -> list[str]:
    """The ssh argv for `python -m rehearsal ssh NAME [cmd...]`."""
    info = status(name)
    if info.state != "running":
        raise RehearsalError(f"rehearsal host {name!r} is {info.state}: "
                             f"`python -m rehearsal up {name}`")
    tty = not command and sys.stdin.isatty()
    return info.ssh_args(tty=tty) + (["--"] + list(command) if command else [])
