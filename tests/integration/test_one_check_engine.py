"""Issue 12.8 / 13.6 through the real engine: `pulumi preview` refuses what `python -m components
plan` refuses, with the same message, before any resource is registered and without contacting
the host. The host is a TCP listener of this test on 127.0.0.1: it counts connections (zero).

Cases: a misspelled namespace key (`gpu-serving:readines`, which preview used to ignore, deploying
the default), an apt source with no signed-by (which plan used to accept), a strategy already
owned by another stack, and a token in clear text. Marked `engine` (needs the cached engine).
"""
from __future__ import annotations

import shutil
import socket
import threading

import pytest
import yaml
from pulumi import automation as auto

from components.__main__ import main as components_main
from tests.integration.test_engine import COPY_IGNORE, VENV, engine, workspace_opts  # noqa: F401 - fixture
from tests.pulumi_env import REPO, settings_only_stack_files

pytestmark = pytest.mark.engine

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"

CASES = {
    "readiness-typo": {"gpu-serving:readines": {"timeoutSeconds": 5}},
    "apt-unsigned": {"gpu-serving:cuda": {"aptRepository": "deb https://mirror.example/cuda/ /",
                                          "keyringSha256": "a" * 64}},
    "strategy-taken": {"gpu-serving:strategy": {"name": "pp8", "tpSize": 8}},
    "token-in-clear": {"gpu-serving:hfToken": "hf_" + "Q" * 34},
}
EXPECT = {
    "readiness-typo": "gpu-serving:readines: unknown setting (did you mean gpu-serving:readiness?)",
    "apt-unsigned": "gpu-serving:cuda.aptRepository:",
    "strategy-taken": "both deploy strategy 'pp8'",
    "token-in-clear": "pulumi config set --secret gpu-serving:hfToken",
}


class Listener:
    """A TCP port that counts who connects: the stand-in host."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


@pytest.fixture(scope="module")
def project(engine, tmp_path_factory):
    dst = tmp_path_factory.mktemp("one-check") / "project"
    shutil.copytree(REPO, dst, ignore=COPY_IGNORE, symlinks=True)
    (dst / ".venv").symlink_to(VENV)
    settings_only_stack_files(dst)
    return dst


@pytest.mark.parametrize("case", sorted(CASES))
def test_preview_refuses_what_plan_refuses_before_any_host_contact(engine, project, case, capsys):
    env, _ = engine
    host = Listener()
    try:
        config = {"gpu-serving:strategy": {"tpSize": 8},
                  "gpu-serving:host": {"address": "127.0.0.1", "port": host.port, "hostKey": KEY,
                                       "privateKeyPath": "/nonexistent/id_ed25519"},
                  **CASES[case]}
        stack_name = f"bad-{case}"
        (project / f"Pulumi.{stack_name}.yaml").write_text(yaml.safe_dump({"config": config}))
        assert components_main(["plan", "--stack", stack_name, "--project-dir", str(project)]) == 2
        plan_message = capsys.readouterr().err.removeprefix("error: ").strip()
        assert EXPECT[case] in plan_message, plan_message

        stack = auto.create_or_select_stack(stack_name=stack_name, work_dir=str(project),
                                            opts=workspace_opts(env, project))
        registered = []

        def on_event(event):
            if event.resource_pre_event is not None:
                registered.append(event.resource_pre_event.metadata.type)

        with pytest.raises(auto.CommandError) as info:
            stack.preview(on_event=on_event)
        text = str(info.value)
        # The program's refusal is plan's, line for line, and nothing else went wrong.
        for line in plan_message.splitlines():
            assert line.strip() in text, (line, text[-3000:])
        assert "Traceback" not in text
        # Only the stack, and the dynamic provider's process, which the program asks for first
        # (components/provider_start.py: it starts while the settings are checked, and holds no
        # resource and no connection): no resource of the program's.
        assert not [t for t in registered if t not in ("pulumi:pulumi:Stack", "pulumi:providers:pulumi-python")], registered
        assert host.connections == 0
        if case == "token-in-clear":
            assert "Q" * 34 not in text and "Q" * 34 not in plan_message
    finally:
        host.close()
        (project / f"Pulumi.bad-{case}.yaml").unlink(missing_ok=True)
