"""The base root file system of every rehearsal host: Debian bookworm built once with
debootstrap, with the files and masked units all instances share baked in. Read-only to the
instances (each boots on an overlay of it, machine.py). Imports common only.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

from .common import (RehearsalError, cache_root, flock, log, require_root, require_tools,
                     safe_rmtree, umount_all_under, write_file)

SUITE = "bookworm"
# Bump when the configuration applied to the base rootfs changes in a way the spec below
# does not capture. The directory name also carries a hash of the spec, so a change of the
# package list or of the baked files rebuilds on its own.
ROOTFS_VERSION = 1
ROOTFS_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
    "curl", "iproute2", "ca-certificates", "procps", "netbase", "less",
)

# rehearsal/gpu/ is bind-mounted read-only at /usr/lib/rehearsal (a directory, so an edit
# that replaces the file in the repository shows at once, and nvidia_smi.py's data file
# nvidia_smi_gpu.xml.template comes with it); /etc/rehearsal/gpu-profile.json is a
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


# --------------------------------------------------------------------------------------
# Building it (once)


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
    write_file(root / "etc/machine-id", "", 0o444)
    dbus_id = root / "var/lib/dbus/machine-id"
    if dbus_id.exists() and not dbus_id.is_symlink():
        dbus_id.unlink()
    # No host keys in the base: each instance gets its own at its first `up`.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    for rel, (content, mode) in BAKED_FILES.items():
        write_file(root / rel, content, mode)
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
    require_root()
    require_tools()
    final = rootfs_dir()
    stamp = final / "etc/rehearsal/rootfs.json"
    if stamp.exists() and not force:
        return final
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with flock(root / ".rootfs.lock") as lock_fd:
        if stamp.exists() and not force:
            return final
        # A crashed build leaves a .build-* dir (maybe with /proc mounted inside): remove it.
        for stale in root.glob(".build-*"):
            log(f"removing incomplete rootfs build {stale}")
            safe_rmtree(stale)
        tmp = root / f".build-{final.name}-{os.getpid()}"
        log_path = root / "rootfs-build.log"
        mirror = _debian_mirror()
        debs = root / "debs"
        debs.mkdir(exist_ok=True)
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}",
                "--components=main", f"--cache-dir={debs}", SUITE, str(tmp), mirror]
        log(f"building the Debian {SUITE} rootfs once (about 2 min; log: {log_path})")
        log(" ".join(argv))
        t0 = time.monotonic()
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C.UTF-8")
        try:
            with open(log_path, "wb") as build_log:
                # debootstrap holds the lock too: if we die, no one touches its dir until
                # it has finished (or died) as well.
                proc = subprocess.run(argv, stdout=build_log, stderr=subprocess.STDOUT, env=env,
                                      timeout=1800, pass_fds=(lock_fd,))
            if proc.returncode != 0:
                tail = log_path.read_text(errors="replace").splitlines()[-20:]
                raise RehearsalError(f"debootstrap failed ({proc.returncode}); last lines of "
                                     f"{log_path}:\n" + "\n".join(tail))
            umount_all_under(tmp)
            _configure_rootfs(tmp)
            spec = _rootfs_spec()
            spec.update(mirror=mirror, built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                              time.gmtime()))
            write_file(tmp / "etc/rehearsal/rootfs.json", json.dumps(spec, indent=2) + "\n")
            if final.exists():
                safe_rmtree(final)  # only with force=True or an unstamped leftover
            os.rename(tmp, final)
        except BaseException:
            safe_rmtree(tmp)
            raise
        log(f"rootfs ready in {time.monotonic() - t0:.0f} s: {final}")
    return final
