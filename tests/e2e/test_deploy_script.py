"""Issue 36.4, for real: `scripts/deploy <stack>` switched with `--yes --skip-preview`, no preview
and no confirmation, also when the stack pointed at a real machine. On one rehearsal host of this
module's own, written once as the rehearsal host (the README's main job: switched at once, as
before) and once as a real machine (an address, its pinned host key, a key file): in a terminal
the preview is shown and pulumi asks (answered "no": nothing changes); from a script it is refused
before any SSH login; with --yes the preview is printed, then the update runs."""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time

import pytest
import yaml

from tests import hardening_support as H

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-{}.service"
PROMPT = b"Do you want to perform this update?"


@pytest.fixture(scope="module")
def d(tmp_path_factory, rehearsal_host_factory):
    host = rehearsal_host_factory()
    d = make_deployment(tmp_path_factory.mktemp("deploy-script"), host)
    H.install_command_log(host)
    return d


def deploy(d, *args: str) -> subprocess.CompletedProcess:
    """`scripts/deploy ARGS` in the deployment's copy, from a script (no terminal)."""
    return subprocess.run(["bash", str(d.project / "scripts" / "deploy"), *args], cwd=d.project, env=d.env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1200)


def deploy_in_a_terminal(d, *args: str, answer: bytes) -> tuple[int, str]:
    """`scripts/deploy ARGS` on a terminal of its own (a pty), answering pulumi's question with
    `answer`; its exit status and what the terminal showed (without escape sequences)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the operator's shell
        os.chdir(d.project)
        os.execvpe("bash", ["bash", str(d.project / "scripts" / "deploy"), *args], d.env)
    shown, answered, deadline = b"", False, time.monotonic() + 1200
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if fd not in ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # the terminal closed: the script ended
                break
            if not data:
                break
            shown += data
            if not answered and PROMPT in shown:
                os.write(fd, answer)
                answered = True
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", shown).decode(errors="replace")


def as_a_real_machine(d) -> None:
    """The module's host written as a real one: address, pinned host key, key file."""
    def real(config):
        h = config["gpu-serving:host"]["value"]
        h.pop("rehearsal", None)
        h.update(address=d.host.address, hostKey=d.host.host_public_key, privateKeyPath=d.host.private_key)
    d.edit_project(real)


def test_on_the_rehearsal_host_the_main_job_switches_at_once_as_before(d):
    done = deploy(d, "ep8")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "Previewing update" not in done.stdout and "Updating (ep8)" in done.stdout, done.stdout[-4000:]
    assert '"status_when_checked": "ready"' in done.stdout, done.stdout[-2000:]
    assert d.sh(f"systemctl is-active {UNIT.format('ep8')}").strip() == "active"


def test_a_real_machine_from_a_script_without_yes_is_refused_before_any_login(d):
    as_a_real_machine(d)
    record = H.HostRecord(d.host)
    mark = record.mark()
    done = deploy(d, "tp8")
    assert done.returncode == 2, (done.stdout + done.stderr)[-4000:]
    assert f"host (root@{d.host.address}:22)" in done.stderr and "scripts/deploy tp8 --yes" in done.stderr, done.stderr
    assert record.since(mark) == ([], 0)  # no command, no SSH login
    assert d.sh(f"systemctl is-active {UNIT.format('ep8')}").strip() == "active"


def test_a_real_machine_in_a_terminal_shows_the_preview_and_asks_and_no_changes_nothing(d):
    status, shown = deploy_in_a_terminal(d, "tp8", answer=b"no\r")
    assert PROMPT.decode() in shown, shown[-4000:]
    before_prompt = shown[:shown.index(PROMPT.decode())]
    # The preview came first: what serves now and stops, what starts.
    assert "Previewing update (tp8)" in before_prompt, before_prompt[-4000:]
    assert f"switch: it will stop; {UNIT.format('tp8')} (stack tp8) starts" in before_prompt, before_prompt[-4000:]
    assert status != 0 and "confirmation declined" in shown, shown[-2000:]
    assert d.sh(f"systemctl is-active {UNIT.format('ep8')}").strip() == "active"
    assert d.sh(f"systemctl is-active {UNIT.format('tp8')} || true").strip() != "active"


def test_a_real_machine_with_yes_prints_the_preview_then_switches(d):
    done = deploy(d, "tp8", "--yes")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out = done.stdout
    assert "Previewing update (tp8)" in out and out.index("Previewing update (tp8)") < out.index("Updating (tp8)"), out[-4000:]
    assert '"status_when_checked": "ready"' in out, out[-2000:]
    assert d.sh(f"systemctl is-active {UNIT.format('tp8')}").strip() == "active"
    # The deploy leaves the stack file's settings as they were (the real-machine form).
    assert yaml.safe_load((d.project / "Pulumi.yaml").read_text())["config"]["gpu-serving:host"]["value"]["address"] == d.host.address
