"""Rehearsal host lifecycle: a real Debian bookworm host (systemd as PID 1, OpenSSH) booted
locally with systemd-nspawn in its own network namespace.

Layout (see docs and `python -m rehearsal --help`):

  ${GPU_SERVING_CACHE:-/var/cache/gpu-serving}/rehearsal/
      rootfs-bookworm-v<N>-<spec hash>/   read-only base, built once by debootstrap
      debs/                               debootstrap's package cache (rebuilds are faster)
      instances/<name>/                   PERSISTENT per-instance state (survives restart)
          instance.json                     name, index, profile, model, rootfs
          id_ed25519, id_ed25519.pub        client key pair (root login)
          ssh_host_ed25519_key{,.pub}       the instance's own host key (pinned)
          upper/ work/                      overlay upper and work dirs
          merged/                           overlay mount point = the container's /
  ${GPU_SERVING_RUN:-/run/gpu-serving}/rehearsal/<name>/
      host.json                           what `up`/`status` print
      nspawn.pid                          PID of the systemd-nspawn process
      known_hosts                         the pinned host key for ssh
      console.log                         the container console (boot messages)

Only the root user can run this (mounts, network namespaces, nspawn).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

# --------------------------------------------------------------------------------------
# Constants

PACKAGE_DIR = Path(__file__).resolve().parent
GPU_DIR = PACKAGE_DIR / "gpu"
GPU_SCRIPT = GPU_DIR / "nvidia_smi.py"
PROFILES_DIR = GPU_DIR / "profiles"
MODELS_DIR = PACKAGE_DIR / "models"

DEFAULT_NAME = "default"
DEFAULT_PROFILE = "rtx-pro-6000-8"
DEFAULT_MODEL = "kimi-k2.6"

SUITE = "bookworm"
# Bump when the configuration applied to the base rootfs changes in a way the spec below
# does not capture. The directory name also carries a hash of the spec, so a change of the
# package list or of the baked files rebuilds on its own.
ROOTFS_VERSION = 1
ROOTFS_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
    "curl", "iproute2", "ca-certificates", "procps", "netbase", "less",
)

SUBNET_PREFIX = "10.213"  # 10.213.<index>.0/24: root side .1, host .2
MAX_INDEX = 254
# The whole range ends on this machine (a no-route entry, `isolate_range`): a host that is
# stopped, rebooting or not booted yet has no /24 of its own, and without it SSH attempts and
# probes to its address would leave through the default route to whatever network owns it.
RANGE = ipaddress.ip_network(f"{SUBNET_PREFIX}.0.0/16")
# Never a host (indexes stop at 254): `isolate_range` checks that it has no route.
NEVER_A_HOST = f"{SUBNET_PREFIX}.255.2"
NO_ROUTE_TYPES = ("blackhole", "unreachable", "prohibit")
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,10}$")  # veth "gsr-<name>" must fit 15 chars
SSH_USER = "root"
SSH_PORT = 22

# rehearsal/gpu/ is bind-mounted read-only at /usr/lib/rehearsal (a directory, so an edit
# that replaces the file in the repository shows at once); /etc/rehearsal/gpu-profile.json is a
# symlink to the profile in there (or a read-only bind of a profile from elsewhere).
GUEST_GPU_DIR = "/usr/lib/rehearsal"
GUEST_NVIDIA_SMI_SCRIPT = f"{GUEST_GPU_DIR}/nvidia_smi.py"
GUEST_PROFILE = "/etc/rehearsal/gpu-profile.json"

# Files baked into the base rootfs (path relative to the rootfs -> content).
SSHD_DROPIN = """\
# gpu-serving rehearsal host: root login by key only, one host key per instance.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
"""
JOURNALD_DROPIN = """\
[Journal]
Storage=persistent
SystemMaxUse=64M
ForwardToConsole=no
"""
NVIDIA_SMI_WRAPPER = f"""\
#!/bin/sh
# gpu-serving rehearsal host: the simulated nvidia-smi is bind-mounted read-only from the
# repository (rehearsal/gpu/nvidia_smi.py) with the profile at {GUEST_PROFILE}.
if [ ! -r {GUEST_NVIDIA_SMI_SCRIPT} ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. (rehearsal: no simulated nvidia-smi mounted)" >&2
  exit 9
fi
exec /usr/bin/python3 {GUEST_NVIDIA_SMI_SCRIPT} "$@"
"""
BAKED_FILES = {
    "etc/ssh/sshd_config.d/10-rehearsal.conf": (SSHD_DROPIN, 0o644),
    "etc/systemd/journald.conf.d/10-rehearsal.conf": (JOURNALD_DROPIN, 0o644),
    "usr/bin/nvidia-smi": (NVIDIA_SMI_WRAPPER, 0o755),
}
MASKED_UNITS = (
    "console-getty.service", "container-getty@.service", "getty@.service",
    "serial-getty@.service", "apt-daily.timer", "apt-daily-upgrade.timer", "fstrim.timer",
    "e2scrub_all.timer", "e2scrub_reap.service", "systemd-networkd-wait-online.service",
)


class RehearsalError(RuntimeError):
    """A rehearsal host operation failed; the message says why and what to do."""


# --------------------------------------------------------------------------------------
# Paths


def cache_root() -> Path:
    return Path(os.environ.get("GPU_SERVING_CACHE") or "/var/cache/gpu-serving") / "rehearsal"


def run_root() -> Path:
    return Path(os.environ.get("GPU_SERVING_RUN") or "/run/gpu-serving") / "rehearsal"


def instances_root() -> Path:
    return cache_root() / "instances"


def instance_dir(name: str) -> Path:
    return instances_root() / name


def state_dir(name: str) -> Path:
    return run_root() / name


def _rootfs_spec() -> dict:
    return {
        "version": ROOTFS_VERSION,
        "suite": SUITE,
        "variant": "minbase",
        "packages": sorted(ROOTFS_PACKAGES),
        "files": {k: v[0] for k, v in sorted(BAKED_FILES.items())},
        "masked": sorted(MASKED_UNITS),
    }


def rootfs_dir() -> Path:
    spec = json.dumps(_rootfs_spec(), sort_keys=True).encode()
    digest = hashlib.sha256(spec).hexdigest()[:8]
    return cache_root() / f"rootfs-{SUITE}-v{ROOTFS_VERSION}-{digest}"


def netns_name(name: str) -> str:
    return f"gsr-{name}"


def veth_name(name: str) -> str:
    return f"gsr-{name}"


def subnet(index: int) -> tuple[str, str]:
    """(root-side address, host address) for an instance index."""
    return f"{SUBNET_PREFIX}.{index}.1", f"{SUBNET_PREFIX}.{index}.2"


def validate_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise RehearsalError(
            f"invalid rehearsal host name {name!r}: use 1-11 characters a-z, 0-9, '-', "
            "starting with a letter (it names the network namespace and the veth "
            f"'gsr-<name>', which Linux limits to 15 characters), e.g. 'default', 'h1'")
    return name


# --------------------------------------------------------------------------------------
# Small helpers


def _log(msg: str) -> None:
    print(f"rehearsal: {msg}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], *, check: bool = True, timeout: Optional[float] = 120,
         capture: bool = True, input: Optional[bytes] = None,
         env: Optional[dict] = None) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(list(argv), input=input, timeout=timeout, env=env,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.PIPE if capture else None)
    except FileNotFoundError as exc:
        raise RehearsalError(f"{argv[0]} not found: run scripts/install-host-deps") from exc
    if check and proc.returncode != 0:
        err = (proc.stderr or b"").decode(errors="replace").strip()
        raise RehearsalError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{err}")
    return proc


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[int]:
    """An exclusive flock; yields the fd (pass it to a child to keep the lock while it runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _instance_lock(name: str):
    return _flock(run_root() / ".locks" / f"{name}.lock")


def _global_lock():
    return _flock(run_root() / ".locks" / "global.lock")


def _write_file(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    data = content.encode() if isinstance(content, str) else content
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _require_root() -> None:
    if os.geteuid() != 0:
        raise RehearsalError("the rehearsal host needs root (mounts, network namespaces, "
                             "systemd-nspawn): run as root")


def _require_tools() -> None:
    missing = [t for t in ("systemd-nspawn", "debootstrap", "ip", "ssh", "ssh-keygen", "mount",
                           "umount") if shutil.which(t) is None]
    if missing:
        raise RehearsalError(f"missing host tools {', '.join(missing)}: run "
                             "scripts/install-host-deps")


# --------------------------------------------------------------------------------------
# Mounts


def _unescape_mount(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` in this mount namespace, deepest first."""
    base = str(path).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mp = _unescape_mount(line.split()[4])
            if mp == base or mp.startswith(base + "/"):
                found.append(mp)
    return sorted(set(found), key=len, reverse=True)


def _umount_all_under(path: Path) -> None:
    for mp in mounts_under(path):
        if _run(["umount", mp], check=False).returncode != 0:
            _run(["umount", "-l", mp], check=False)
    left = mounts_under(path)
    if left:
        raise RehearsalError(f"could not unmount {', '.join(left)}")


def _safe_rmtree(path: Path) -> None:
    """rm -rf that first unmounts anything below `path` and never crosses a file system."""
    if not path.exists() and not path.is_symlink():
        return
    _umount_all_under(path)
    _run(["rm", "-rf", "--one-file-system", str(path)], timeout=600)


# --------------------------------------------------------------------------------------
# Root file system (built once)


def _debian_mirror() -> str:
    """The Debian mirror of this machine's apt sources (suite bookworm), or deb.debian.org."""
    if os.environ.get("REHEARSAL_DEBIAN_MIRROR"):
        return os.environ["REHEARSAL_DEBIAN_MIRROR"]
    candidates: list[tuple[str, list[str]]] = []
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*"))
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.split()
                if "deb" in fields.get("types", []):
                    for uri in fields.get("uris", []):
                        candidates.append((uri, fields.get("suites", [])))
        else:
            for line in text.splitlines():
                parts = line.split("#", 1)[0].split()
                if len(parts) >= 3 and parts[0] == "deb":
                    rest = [p for p in parts[1:] if not p.startswith("[")]
                    if len(rest) >= 2:
                        candidates.append((rest[0], [rest[1]]))
    for uri, suites in candidates:
        if SUITE in suites and "security" not in uri:
            return uri
    return "http://deb.debian.org/debian"


def _configure_rootfs(root: Path) -> None:
    # Each instance gets its machine id at first boot (written into its overlay).
    _write_file(root / "etc/machine-id", "", 0o444)
    dbus_id = root / "var/lib/dbus/machine-id"
    if dbus_id.exists() and not dbus_id.is_symlink():
        dbus_id.unlink()
    # No host keys in the base: each instance gets its own at its first `up`.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    for rel, (content, mode) in BAKED_FILES.items():
        _write_file(root / rel, content, mode)
    for unit in MASKED_UNITS:
        link = root / "etc/systemd/system" / unit
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to("/dev/null")
    (root / "var/log/journal").mkdir(parents=True, exist_ok=True)
    (root / "etc/rehearsal").mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(exist_ok=True)
    (root / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root / "root/.ssh", 0o700)
    hostname = root / "etc/hostname"
    if hostname.exists():
        hostname.unlink()
    # Drop what debootstrap leaves behind that no instance needs.
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin",
                    "var/lib/apt/lists/*_Packages", "var/lib/apt/lists/*_Release*",
                    "var/log/*.log"):
        for p in root.glob(pattern):
            if p.is_file():
                p.unlink()


def ensure_rootfs(force: bool = False) -> Path:
    """Build the base rootfs once (debootstrap into a temp dir, renamed when complete)."""
    _require_root()
    _require_tools()
    final = rootfs_dir()
    stamp = final / "etc/rehearsal/rootfs.json"
    if stamp.exists() and not force:
        return final
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with _flock(root / ".rootfs.lock") as lock_fd:
        if stamp.exists() and not force:
            return final
        # A crashed build leaves a .build-* dir (maybe with /proc mounted inside): remove it.
        for stale in root.glob(".build-*"):
            _log(f"removing incomplete rootfs build {stale}")
            _safe_rmtree(stale)
        tmp = root / f".build-{final.name}-{os.getpid()}"
        log_path = root / "rootfs-build.log"
        mirror = _debian_mirror()
        debs = root / "debs"
        debs.mkdir(exist_ok=True)
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}",
                "--components=main", f"--cache-dir={debs}", SUITE, str(tmp), mirror]
        _log(f"building the Debian {SUITE} rootfs once (about 2 min; log: {log_path})")
        _log(" ".join(argv))
        t0 = time.monotonic()
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C.UTF-8")
        try:
            with open(log_path, "wb") as log:
                # debootstrap holds the lock too: if we die, no one touches its dir until
                # it has finished (or died) as well.
                proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      timeout=1800, pass_fds=(lock_fd,))
            if proc.returncode != 0:
                tail = log_path.read_text(errors="replace").splitlines()[-20:]
                raise RehearsalError(f"debootstrap failed ({proc.returncode}); last lines of "
                                     f"{log_path}:\n" + "\n".join(tail))
            _umount_all_under(tmp)
            _configure_rootfs(tmp)
            spec = _rootfs_spec()
            spec.update(mirror=mirror, built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                              time.gmtime()))
            _write_file(tmp / "etc/rehearsal/rootfs.json", json.dumps(spec, indent=2) + "\n")
            if final.exists():
                _safe_rmtree(final)  # only with force=True or an unstamped leftover
            os.rename(tmp, final)
        except BaseException:
            _safe_rmtree(tmp)
            raise
        _log(f"rootfs ready in {time.monotonic() - t0:.0f} s: {final}")
    return final


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
        _write_file(instance_dir(self.name) / "instance.json",
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
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
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
        with _global_lock():
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


def _is_mounted(path: Path) -> bool:
    return str(path) in mounts_under(path)


def _mount_overlay(cfg: InstanceConfig) -> Path:
    idir = instance_dir(cfg.name)
    merged = idir / "merged"
    _umount_all_under(merged)  # stale from a crash: start clean
    # A crashed overlay may leave its work dir busy; clear it (it holds no state).
    work = idir / "work"
    if work.exists():
        _safe_rmtree(work)
    work.mkdir()
    opts = f"lowerdir={cfg.rootfs},upperdir={idir / 'upper'},workdir={work}"
    _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)])
    return merged


def _provision(cfg: InstanceConfig, merged: Path) -> None:
    """Files each boot needs in the instance (written into its overlay upper dir)."""
    idir = instance_dir(cfg.name)
    ssh_dir = merged / "etc/ssh"
    for suffix, mode in (("", 0o600), (".pub", 0o644)):
        src = idir / f"ssh_host_ed25519_key{suffix}"
        _write_file(ssh_dir / f"ssh_host_ed25519_key{suffix}", src.read_bytes(), mode)
    root_ssh = merged / "root/.ssh"
    root_ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root_ssh, 0o700)
    auth = root_ssh / "authorized_keys"
    pub = (idir / "id_ed25519.pub").read_text().strip()
    existing = auth.read_text() if auth.exists() else ""
    if pub not in existing.splitlines():
        if existing and not existing.endswith("\n"):
            existing += "\n"
        _write_file(auth, existing + pub + "\n", 0o600)
    _write_file(merged / "etc/hostname", cfg.name + "\n")
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
# Network


def _netns_exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def _link_exists(dev: str, ns: Optional[str] = None) -> bool:
    argv = ["ip"] + (["-n", ns] if ns else []) + ["link", "show", "dev", dev]
    return _run(argv, check=False).returncode == 0


def _ip_json(*argv: str) -> list[dict]:
    proc = _run(["ip", "-j", *argv])
    text = proc.stdout.decode(errors="replace").strip()
    return json.loads(text) if text else []


def _ours(dev: Optional[str]) -> bool:
    """A rehearsal host's veth (root side): `gsr-<name>`."""
    return bool(dev) and dev.startswith(veth_name(""))


def range_collisions() -> list[str]:
    """What attaches this machine to a network overlapping the rehearsal range, other than the
    hosts' own veths and the range's no-route entry: addresses and routes (every table), as
    text for an error message. The default route is not a collision (the range is carved out of
    it); a no-route entry of any size is not a network."""
    found = []
    for link in _ip_json("-4", "addr", "show"):
        if _ours(link.get("ifname")):
            continue
        for a in link.get("addr_info", []):
            net = ipaddress.ip_network(f"{a['local']}/{a.get('prefixlen', 32)}", strict=False)
            if net.overlaps(RANGE):
                found.append(f"address {a['local']}/{a.get('prefixlen', 32)} on {link['ifname']}")
    for r in _ip_json("-4", "route", "show", "table", "all"):
        dst = r.get("dst", "default")
        # local/broadcast entries come from an address, listed above already
        if (dst == "default" or r.get("type") in NO_ROUTE_TYPES + ("local", "broadcast")
                or _ours(r.get("dev"))):
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.prefixlen and net.overlaps(RANGE):
            how = " ".join(f"{word} {r[k]}" for k, word in (("gateway", "via"), ("dev", "dev"),
                                                             ("table", "table")) if r.get(k))
            found.append(f"route {' '.join(filter(None, [r.get('type'), dst]))} {how}".strip())
    return found


def _has_no_route_entry() -> bool:
    for r in _ip_json("-4", "route", "show", "exact", str(RANGE)):
        if r.get("type") in NO_ROUTE_TYPES:
            return True
    return False


def isolate_range() -> str:
    """Make the rehearsal range end on this machine, idempotently: refuse when the machine is
    attached to a network overlapping it, add an `unreachable` route for the whole range when
    there is no no-route entry yet (an existing blackhole counts), and check that an address of
    the range no host ever has is not routable. The per-host /24 on each veth is more specific
    and keeps working. Returns what it did, for a log line."""
    _require_root()
    with _global_lock():
        collisions = range_collisions()
        if collisions:
            raise RehearsalError(
                f"the rehearsal hosts' address range {RANGE} overlaps a network this machine is "
                f"attached to ({'; '.join(collisions)}): rehearsal traffic must never leave this "
                "machine, so no rehearsal host starts here. Remove that address or route, or "
                "run the rehearsal on a machine that is not attached to that range")
        done = f"{RANGE} already ends here (no-route entry present)"
        if not _has_no_route_entry():
            _run(["ip", "route", "replace", "unreachable", str(RANGE)])
            done = f"added `unreachable {RANGE}`: the rehearsal range ends on this machine"
        probe = _run(["ip", "route", "get", NEVER_A_HOST], check=False)
        if probe.returncode == 0:
            raise RehearsalError(
                f"{NEVER_A_HOST} (in the rehearsal range {RANGE}, never a host) is still "
                f"routable ({probe.stdout.decode(errors='replace').strip()}) despite the "
                f"no-route entry: a policy rule (`ip rule`) sends the range elsewhere; "
                "rehearsal traffic must never leave this machine, so no rehearsal host starts")
    return done


def _network_up(cfg: InstanceConfig) -> None:
    ns, veth = netns_name(cfg.name), veth_name(cfg.name)
    gw, addr = subnet(cfg.index)
    if not _netns_exists(ns):
        _run(["ip", "netns", "add", ns])
    if not _link_exists("host0", ns):
        if _link_exists(veth):
            _run(["ip", "link", "del", veth])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "host0", "netns", ns])
    _run(["ip", "addr", "replace", f"{gw}/24", "dev", veth])
    _run(["ip", "link", "set", veth, "up"])
    _run(["ip", "-n", ns, "addr", "replace", f"{addr}/24", "dev", "host0"])
    _run(["ip", "-n", ns, "link", "set", "host0", "up"])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])


def _network_down(name: str) -> None:
    ns, veth = netns_name(name), veth_name(name)
    if _link_exists(veth):
        _run(["ip", "link", "del", veth], check=False)
    if _netns_exists(ns):
        _run(["ip", "netns", "del", ns], check=False)
        if _netns_exists(ns):  # ip netns del leaves the file if unmount failed
            _run(["umount", "-l", f"/run/netns/{ns}"], check=False)
            with contextlib.suppress(OSError):
                os.unlink(f"/run/netns/{ns}")


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
            _log(f"{name}: killing {len(pids)} leftover container process(es)")
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
                    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
                    os.dup2(null, 0)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
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
        argv.append(f"--bind-ro={cfg.model_source}:/models/{cfg.model}")
    return argv


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
    model_source: Optional[str] = None     # the repository directory mounted there
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


def _port_open(addr: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


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
        if not _port_open(info.address, info.port):
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
    _write_file(Path(info.state_dir) / "host.json", info.to_json() + "\n", 0o644)


def _cleanup_stale(name: str, stale: bool = True) -> None:
    """Remove what a stopped or crashed run left: PID file, leftover container processes,
    overlay mount, netns, veth. `stale`: say so when a PID file shows a run that crashed."""
    sdir = state_dir(name)
    pidfile = sdir / "nspawn.pid"
    if pidfile.exists():
        if stale:
            _log(f"{name}: cleaning up after a run that did not stop cleanly")
        pidfile.unlink()
    with contextlib.suppress(FileNotFoundError):
        (sdir / "host.json").unlink()
    _kill_container_pids(name)
    merged = instance_dir(name) / "merged"
    if mounts_under(merged):
        _umount_all_under(merged)
    _network_down(name)


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
        _log(f"{name}: no clean poweroff within {timeout:.0f} s; killing")
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
    sdir = state_dir(name)
    sdir.mkdir(parents=True, exist_ok=True)
    os.chmod(sdir, 0o755)
    t0 = time.monotonic()
    pid = None
    try:
        merged = _mount_overlay(cfg)
        _provision(cfg, merged)
        _network_up(cfg)
        info = _info(name, "starting", cfg)
        _write_file(Path(info.known_hosts), f"{info.address} {info.host_public_key}\n")
        pid = _spawn_detached(_nspawn_argv(cfg, merged), sdir / "console.log")
        _write_file(sdir / "nspawn.pid", f"{pid}\n")
        _wait_ready(info, pid, timeout)
    except BaseException:
        _log(f"{name}: boot failed; stopping it (console log: {sdir / 'console.log'})")
        if pid and _alive(pid):
            _stop_container(name, pid, 15)
        _cleanup_stale(name, stale=False)
        raise
    info = _info(name, "running", cfg, pid)
    info.started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write_host_json(info)
    _log(f"{name}: up in {time.monotonic() - t0:.1f} s at {info.address}")
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
    _require_root()
    _require_tools()
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
    _require_root()
    with _instance_lock(name):
        _power_off(name, timeout)
    return status(name)


def restart(name: str = DEFAULT_NAME, timeout: float = 120.0,
            stop_timeout: float = 30.0) -> HostInfo:
    """Clean poweroff, then boot again on the same persistent disk (like a reboot)."""
    validate_name(name)
    _require_root()
    _require_tools()
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
    _require_root()
    with _instance_lock(name):
        _power_off(name, timeout)
        _safe_rmtree(instance_dir(name))
        _safe_rmtree(state_dir(name))


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


class RehearsalHost:
    """Python API (the same as the module functions)."""
    up = staticmethod(up)
    down = staticmethod(down)
    stop = staticmethod(stop)
    restart = staticmethod(restart)
    status = staticmethod(status)
    list = staticmethod(list_hosts)
    ssh_argv = staticmethod(ssh_argv)
    ensure_rootfs = staticmethod(ensure_rootfs)
    isolate_range = staticmethod(isolate_range)
