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


# The variable that names the Debian mirror outright, when this machine's apt sources name none
# of suite SUITE (a machine of another distribution, or one whose sources are elsewhere).
MIRROR_VARIABLE = "REHEARSAL_DEBIAN_MIRROR"
APT_SOURCES = Path("/etc/apt/sources.list")
APT_SOURCE_PARTS = Path("/etc/apt/sources.list.d")
# What debootstrap can fetch from.
MIRROR_SCHEMES = ("http://", "https://", "file:/")


def apt_source_files(sources: Path = APT_SOURCES, parts: Path = APT_SOURCE_PARTS) -> list[Path]:
    """The files apt reads its sources from, in its order: sources.list, then the parts' *.list
    (one-line form) and *.sources (deb822 form) by name; apt ignores any other name there."""
    try:
        named = sorted((p for p in parts.iterdir() if p.suffix in (".list", ".sources")), key=lambda p: p.name)
    except OSError:
        named = []
    return [sources, *named]


def one_line_sources(text: str) -> list[tuple[str, list[str]]]:
    """(URI, [suite]) of each `deb [options] URI suite components` line (sources.list(5))."""
    found = []
    for line in text.splitlines():
        m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.split("#", 1)[0])
        if m:
            found.append((m.group(1), [m.group(2)]))
    return found


def deb822_sources(text: str) -> list[tuple[str, list[str]]]:
    """(URI, suites) of each enabled `Types: deb` stanza (sources.list(5), deb822 form): fields
    `Name: value`, a value continued on lines that start with a blank, stanzas apart by an empty
    line, `#` lines left out."""
    found = []
    for stanza in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        last = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and last is not None:
                fields[last] += " " + line.strip()
            elif ":" in line:
                name, value = line.split(":", 1)
                last = name.strip().lower()
                fields[last] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            found += [(uri, fields.get("suites", "").split()) for uri in fields.get("uris", "").split()]
    return found


def debian_mirror(environ=os.environ, sources: Path = APT_SOURCES, parts: Path = APT_SOURCE_PARTS) -> str:
    """The Debian mirror debootstrap builds the base from: `REHEARSAL_DEBIAN_MIRROR`, else the
    first source of suite SUITE in this machine's apt sources. Never a mirror of our own choosing:
    with none of them, RehearsalError names the files read and the variable."""
    if environ.get(MIRROR_VARIABLE):
        return environ[MIRROR_VARIABLE]
    files = apt_source_files(sources, parts)
    read = []
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            read.append(f"{f} (absent)" if not f.exists() else f"{f} (unreadable)")
            continue
        read.append(str(f))
        for uri, suites in (deb822_sources(text) if f.suffix == ".sources" else one_line_sources(text)):
            if SUITE in suites and uri.startswith(MIRROR_SCHEMES):
                return uri
    if len(files) == 1:
        read.append(f"no *.list or *.sources in {parts}")
    raise RehearsalError(
        f"no Debian {SUITE} mirror to build the rehearsal hosts' base from: this machine's apt sources "
        f"({', '.join(read)}) name no `deb` source of suite {SUITE} over http(s) or file. Set {MIRROR_VARIABLE} "
        f"to the URL of a Debian mirror that carries {SUITE} (e.g. {MIRROR_VARIABLE}=http://<mirror>/debian), "
        "then run `python -m rehearsal up` again")


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
        mirror = debian_mirror()
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
