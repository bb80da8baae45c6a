"""Shared pytest fixtures.

Rehearsal hosts (real Debian bookworm hosts in systemd-nspawn, see rehearsal/host.py):

- ``rehearsal_host`` (session): one booted host, a ``rehearsal.HostInfo`` (``.address``,
  ``.port``, ``.user``, ``.private_key``, ``.host_public_key``, ``.known_hosts``,
  ``.model_path``, ``.run(cmd)``, ``.put(local, remote)``, ``.ssh_args()``). Named
  ``pt<pid>``; powered off and removed at the end of the session, also when tests fail.
  With ``GPU_SERVING_TEST_HOST=NAME`` set, that instance is brought up (idempotent) and
  reused, and left running afterwards.
- ``rehearsal_host_factory`` (session): ``make(**up_kwargs) -> HostInfo`` boots one more host
  (``pt<pid>a``, ``pt<pid>b``, ...); every host it made and that is still there is removed at the
  end of the session.

Tests that use them need root and scripts/install-host-deps; mark them ``rehearsal``.
"""
from __future__ import annotations

import itertools
import os
import re
import string

import pytest

# pt<pid> (the shared host), pt<pid><letter> (the factory), pt<pid>-<letter> (a test's own
# one-off host: never one of the factory's names, which a test cannot know in advance)
_TEST_NAME = re.compile(r"^pt(\d+)(?:-?[a-z]{1,2})?$")


def pytest_configure(config):
    # The hardening summary line (tests/hardening_support.py), printed when those tests counted.
    from tests.hardening_support import SummaryPlugin
    config.pluginmanager.register(SummaryPlugin(), "gpu-serving-hardening")
    config.pluginmanager.register(ModuleTimes(), "gpu-serving-module-times")
    config.pluginmanager.register(WarmProcesses(), "gpu-serving-warm-processes")
    config.pluginmanager.register(OwnLedger(), "gpu-serving-own-ledger")


class OwnLedger:
    """The failure ledger lives beside the state PULUMI_BACKEND_URL names (scripts/env.sh: the
    checkout's .pulumi-state). A failed switch a test runs in this process records there, and
    `plan` reads there: each test process gets a state folder of its own, removed at the end, so
    no test writes the checkout's ledger or reads what another run left. An engine run is given
    its own backend URL (tests/pulumi_env.py), as every test that reads a ledger gives its own."""

    def __init__(self):
        self.dir = f"/tmp/gsl-pt{os.getpid()}"
        os.environ["PULUMI_BACKEND_URL"] = f"file://{self.dir}"

    def pytest_unconfigure(self, config):
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


class WarmProcesses:
    """The warm processes (gpu-serving-pyrun.py `_gs_warm`) of the engine runs this process
    starts: one per project copy, each otherwise idle for 15 minutes after its last run. They get
    a socket directory of this process's own (inherited by every engine run it starts), and are
    ended, by PID, when this process's session ends; a warm process left by a killed session ends
    by itself once idle (GPU_SERVING_WARM_IDLE_SECONDS, shortened here)."""

    def __init__(self):
        self.dir = f"/tmp/gsw-pt{os.getpid()}"
        os.environ["GPU_SERVING_WARM_DIR"] = self.dir
        os.environ.setdefault("GPU_SERVING_WARM_IDLE_SECONDS", "300")

    def pytest_unconfigure(self, config):
        import shutil
        import signal

        from tests.warm_support import warm_processes

        for pid in warm_processes(self.dir, forks=True):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


class ModuleTimes:
    """Wall time per test file (set-up, calls and teardown of its tests, module fixtures
    included), printed at the end: CI must stay well under an hour, and this says where it goes."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] = self.seconds.get(module, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter):
        slow = sorted(((s, m) for m, s in self.seconds.items() if s >= 30), reverse=True)
        if slow:
            terminalreporter.write_sep("-", "time per test file (30 s and more)")
            for seconds, module in slow:
                terminalreporter.write_line(f"{seconds:8.0f} s  {module}")


def _reap_abandoned_test_hosts() -> None:
    """Remove hosts left by an earlier pytest session that was killed before its teardown."""
    from rehearsal import host

    for info in host.list_hosts():
        m = _TEST_NAME.match(info.name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            cmdline = open(f"/proc/{m.group(1)}/cmdline", "rb").read()
        except OSError:
            cmdline = b""
        # A pytest-xdist worker's command line is execnet's bootstrap (`python -c ...`), not
        # pytest's: a live Python process that made test hosts is taken for their owner.
        if b"pytest" not in cmdline and b"python" not in cmdline:
            host.down(info.name)


def _check_can_boot() -> None:
    from rehearsal import common

    if os.geteuid() != 0:
        pytest.fail("rehearsal hosts need root (systemd-nspawn, mounts, network namespaces)")
    try:
        common.require_tools()
    except common.RehearsalError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def rehearsal_host_factory():
    from rehearsal import host

    _check_can_boot()
    _reap_abandoned_test_hosts()
    made: list[str] = []
    # a..z, then aa..zz: a session may boot more than 26 hosts (names stay within 11 chars)
    suffixes = itertools.chain(string.ascii_lowercase,
                               map("".join, itertools.product(string.ascii_lowercase, repeat=2)))

    def make(**kwargs) -> "host.HostInfo":
        name = f"pt{os.getpid()}{next(suffixes)}"
        made.append(name)
        return host.up(name, **kwargs)

    try:
        yield make
    finally:
        for name in made:
            host.down(name)


@pytest.fixture(scope="session")
def rehearsal_host():
    from rehearsal import host

    _check_can_boot()
    shared = os.environ.get("GPU_SERVING_TEST_HOST")
    if shared:
        yield host.up(shared)
        return
    _reap_abandoned_test_hosts()
    name = f"pt{os.getpid()}"
    try:
        yield host.up(name)
    finally:
        host.down(name)


@pytest.fixture(autouse=True)
def _no_claims_from_another_test():
    """The providers record what a run declares (remote/identity.py `_claimed`, one provider
    process per run); tests calling a provider's `check` share one process, so each starts empty."""
    import sys
    identity = sys.modules.get("components.remote.identity")
    if identity is not None:
        identity._claimed.clear()
    yield
