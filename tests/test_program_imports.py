"""What a program run loads before it declares anything (issue 18: the program's start-up is
its imports). Each check runs a fresh interpreter through gpu-serving-pyrun.py, as our language
host runs the program, and fails if a module the run does not use creeps back into the program's
imports. No timing here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "scripts" / "pulumi-build" / "language-python" / "gpu-serving-pyrun.py"

PROBE = """
import gc, json, os, sys
sys.path.insert(0, os.getcwd())  # the program's directory, as the language host's exec script sets it
gc_before = gc.isenabled()
source = open("__main__.py").read()
# __main__.py up to its run(): the imports the program makes, with its gc handling.
exec(compile(source.rsplit("run()", 1)[0], "__main__.py", "exec"), {"__name__": "probe"})
print(json.dumps({"modules": sorted(sys.modules), "gc_enabled": gc.isenabled(), "gc_before": gc_before,
                  "frozen": gc.get_freeze_count()}))
"""


def program_start(tmp_path: Path) -> dict:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = subprocess.run([sys.executable, "-u", str(RUNNER), "--script", str(probe)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_program_loads_no_ssh_and_no_automation_api(tmp_path):
    modules = set(program_start(tmp_path)["modules"])
    assert "components.program" in modules
    # The program never connects: paramiko is the provider process's (components/remote/lazy_paramiko.py
    # loads it on first use). Nor does it drive Pulumi from inside: the runner defers the
    # Automation API that `import pulumi` would load.
    assert not {m for m in modules if m.startswith("paramiko.")}  # "paramiko" itself: its lazy stand-in
    assert not {m for m in modules if m.startswith("pulumi.automation._")}


def test_the_program_collects_garbage_again_after_its_imports(tmp_path):
    seen = program_start(tmp_path)
    assert seen["gc_before"] and seen["gc_enabled"]
    assert seen["frozen"] > 10_000  # the imported objects are left out of later collections


PROVIDER_PROBE = """
import json, sys
import pulumi.dynamic
import components.remote.providers, components.remote.installers, components.remote.multinode, components.remote.router
from components.remote import ssh
ssh.paramiko.Transport  # what the first connection loads
print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))
"""


def test_the_dynamic_providers_load_without_the_settings_models(tmp_path):
    # Every program run starts a provider process, and its first call loads the provider classes
    # (dill, by module). They check values with core/rules.py and never build settings: pydantic
    # and the settings models were ~0.16 s of that first call, i.e. of every refresh's first read.
    probe = tmp_path / "provider_probe.py"
    probe.write_text(PROVIDER_PROBE)
    proc = subprocess.run([sys.executable, "-u", str(RUNNER), "--script", str(probe)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    modules = set(json.loads(proc.stdout))
    assert "components.remote.providers" in modules
    assert "components.core.rules" in modules
    assert not {m for m in modules if m == "pydantic" or m.startswith("pydantic.")}
    assert "components.core.config" not in modules
    # paramiko's optional use of invoke (ssh_config `Match exec`, never read here) is not loaded.
    assert "paramiko.transport" in modules
    assert not {m for m in modules if m == "invoke" or m.startswith("invoke.")}
