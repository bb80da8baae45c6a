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
        if b"pytest" not in cmdline:
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
