"""The provider process shows the errors gpu-serving raises on purpose as their message alone,
one line naming the host entry, and anything else with its traceback (issue 36.12: with warm
starts, every error came with a full Python traceback, because the hook looked for the provider
server when the warm process imported the providers, before its fork ran the server)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import traceback
import types
from pathlib import Path

import pytest

from components.remote import provider_errors, providers, ssh

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def as_provider_server(monkeypatch):
    """This process, as the fork that serves the provider sees itself (runpy: __main__ is the server)."""
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="pulumi.dynamic.__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)


def formatted(exc: BaseException) -> str:
    try:
        raise exc
    except BaseException:
        return traceback.format_exc()


def test_the_hook_is_in_place_whatever_process_imported_the_providers():
    # This process (pytest) imported them, as the warm process does: the hook is installed all the same.
    assert getattr(traceback.format_exc, "gpu_serving", False) is True


def test_our_errors_are_one_line_in_the_provider_server(as_provider_server):
    text = formatted(ssh.Unreachable("hosts[gpu3]: cannot reach root@10.213.4.2:22 over SSH after 3 attempt(s) in 4 s"))
    assert text == "hosts[gpu3]: cannot reach root@10.213.4.2:22 over SSH after 3 attempt(s) in 4 s"
    assert formatted(providers.DeployError("the roll to pp8 is refused")) == "the roll to pp8 is refused"


def test_a_bug_keeps_its_traceback(as_provider_server):
    assert formatted(KeyError("unit")).startswith("Traceback (most recent call last):")


def test_outside_the_provider_server_nothing_changes():
    assert formatted(ssh.RemoteError("x")).startswith("Traceback (most recent call last):")


def test_an_unreachable_fleet_host_is_named_by_its_entry(monkeypatch):
    monkeypatch.setattr(ssh, "CONNECT_BACKOFF", ())
    t = ssh.Target(host="127.0.0.1", port=9, user="root", private_key="", host_key="ssh-ed25519 AAAA", connect_timeout=1,
                   entry="hosts[gpu3]")
    monkeypatch.setattr(ssh, "_load_key", lambda pem: None)
    monkeypatch.setattr(ssh.paramiko.PKey, "from_type_string", staticmethod(lambda kind, data: types.SimpleNamespace(
        get_name=lambda: kind)))
    with pytest.raises(ssh.Unreachable) as exc:
        ssh._connect(t)
    assert str(exc.value).startswith("hosts[gpu3]: cannot reach root@127.0.0.1:9 over SSH after 1 attempt(s)"), exc.value


def test_a_host_that_sends_no_banner_prints_no_traceback_of_paramikos_own():
    """paramiko's transport thread logged 'Exception (client): Error reading SSH protocol banner'
    with two tracebacks on stderr (the provider's stderr is in the engine's output) before our
    one-line error said the same. In a process of its own, as the provider is (pytest's logging
    would catch what such a process prints)."""
    script = textwrap.dedent("""
        import socket, threading
        from components.remote import ssh
        from tests.test_ssh_nodelay import loopback, new_key, public_line, target
        held = []
        listener = loopback(held.append)  # accepts, says nothing
        try:
            ssh._connect(target(listener.getsockname()[1], public_line(new_key()[1]), new_key()[0], timeout=0.3))
        except ssh.Unreachable as exc:
            print("UNREACHABLE", exc)
        for thread in threading.enumerate():  # paramiko's transport thread logs as it ends
            if isinstance(thread, ssh.paramiko.Transport):
                thread.join(10)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("UNREACHABLE cannot reach root@127.0.0.1:"), (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "SSH protocol banner" not in done.stderr, done.stderr


def test_a_fleet_hosts_failed_rollback_is_named_and_keeps_its_outputs():
    """A fleet host's (hostEntry) failed rollback: the service records the outputs and the named
    message (switchFailure). Naming it used to build RollbackFailed without its outputs, and the
    update failed with a TypeError instead of recording that nothing serves."""
    exc = providers.RollbackFailed("readiness: crashed: exit 1\nrollback failed: nothing serves", {"active": False})
    named = provider_errors.named("gpu1", exc)
    assert isinstance(named, providers.RollbackFailed) and named.outs == {"active": False}
    assert str(named) == "hosts[gpu1]: readiness: crashed: exit 1\nrollback failed: nothing serves"
    outs = providers.ServiceProvider._after_failed_rollback({"hostEntry": "gpu1"}, exc)
    assert outs == {"hostEntry": "gpu1", "active": False, "switchFailure": str(named)}
