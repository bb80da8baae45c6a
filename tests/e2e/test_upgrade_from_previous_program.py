"""Upgrading the program under deployed stacks (issue 14): stacks deployed by the previous
program refresh, update and destroy with this one, replacing nothing and leaving the server
running.

Why it can break: each dynamic resource's provider is pickled (dill, by module path and class
name) into the stack's state, and each resource is known by its type token. A provider class
moved or renamed without a shim at its old path makes refresh/destroy of deployed stacks fail
to unpickle; a type token changed without an alias makes the engine replace the resource (a
serving unit deleted and created again: the server restarts).

Two copies of the project share one state backend: the previous program (a git commit, below)
and this working tree, on one rehearsal host. The previous program deploys pp8 then tp8 (tp8
serves); this program then destroys pp8 untouched (its state is purely the old program's), and
refreshes, previews, updates, checks and switches tp8."""
from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from tests.pulumi_env import REPO
from tests.test_program_mocks import DYNAMIC, PREVIOUS_TYPE, TOKENS
from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

# The program whose deployed stacks this working tree must take over: today's main before the
# components/ restructure (issue 14). Move it forward to the last released main whenever a later
# change might break deployed state (a moved provider class, a new type token, a changed input).
PREVIOUS_PROGRAM = "0e82a47"

UNIT = "sglang-kimi-k2.6-{}.service"
# Steps that would delete something a deployed stack runs: none may appear on the upgrade.
DESTRUCTIVE = {"create", "replace", "create-replacement", "delete", "delete-replaced",
               "read-replacement", "import-replacement"}


def previous_tree(dest: Path) -> Path:
    """The files of PREVIOUS_PROGRAM, from this clone's history (CI clones in full)."""
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet",
                            f"{PREVIOUS_PROGRAM}^{{commit}}"], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.fail(f"commit {PREVIOUS_PROGRAM} (PREVIOUS_PROGRAM, the program deployed stacks were made "
                    f"with) is not in {REPO}: clone with full history (git fetch --unshallow), "
                    f"or move PREVIOUS_PROGRAM to a commit this clone has", pytrace=False)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", found.stdout.strip()],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    # The rehearsal engine (the stand-in for SGLang, built into the venv's wheel) is not the
    # program: a newer engine is a package upgrade the venv resource rightly installs. Both
    # programs deploy this tree's engine, so only the program's own changes are compared.
    # (With its wheel builder: which files a wheel carries belongs to the engine.)
    shutil.rmtree(dest / "rehearsal" / "engine")
    shutil.copytree(REPO / "rehearsal" / "engine", dest / "rehearsal" / "engine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    shutil.copy2(REPO / "rehearsal" / "engine_wheel.py", dest / "rehearsal" / "engine_wheel.py")
    return dest


def carry_salt(old, new, stack: str) -> None:
    """The passphrase salt the previous program's first run wrote into its stack file, kept in
    this program's copy of that file: a user's local stack file survives a `git pull`."""
    old_doc = yaml.safe_load((old.project / f"Pulumi.{stack}.yaml").read_text()) or {}
    path = new.project / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text()) or {}
    if "encryptionsalt" in old_doc:
        doc["encryptionsalt"] = old_doc["encryptionsalt"]
        path.write_text(yaml.safe_dump(doc, sort_keys=False))


class Steps:
    """The engine's steps of one operation: (op, urn) for every resource it looked at."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []
        self.changed: dict[str, list[str]] = {}  # urn -> the keys the engine says differ

    def __call__(self, event: auto.EngineEvent) -> None:
        pre = event.resource_pre_event
        if pre is not None:
            self.seen.append((str(pre.metadata.op.value), pre.metadata.urn))
            if pre.metadata.diffs:
                self.changed[pre.metadata.urn] = list(pre.metadata.diffs)
                old = (pre.metadata.old.inputs if pre.metadata.old else {}) or {}
                new = (pre.metadata.new.inputs if pre.metadata.new else {}) or {}
                for key in pre.metadata.diffs:
                    self.changed[pre.metadata.urn].append(f"{key}: {old.get(key)!r:.200} -> {new.get(key)!r:.200}")

    def ops(self) -> set[str]:
        return {op for op, _ in self.seen}

    def with_op(self, *ops: str) -> list[str]:
        """Steps with one of `ops` on the program's resources. The default `pulumi-python`
        provider is left out of "update": the engine hands it the whole stack config (so that a
        dynamic provider can read it), so a setting new in Pulumi.yaml (gpu-serving:benchmark)
        updates that provider's inputs; nothing runs on a host for it. Its replacement would
        still show here (every DESTRUCTIVE op counts for it)."""
        return [f"{op} {urn} {self.changed.get(urn, '')}" for op, urn in self.seen
                if op in ops and not (op == "update" and urn.endswith("::pulumi:providers:pulumi-python::default"))]


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory, rehearsal_host_factory):
    host = rehearsal_host_factory()
    tmp = tmp_path_factory.mktemp("upgrade")
    source = previous_tree(tmp / "previous-tree")
    old = make_deployment(tmp, host, source=source, name="previous")
    new = make_deployment(tmp, host)

    new.edit_project(previous_flags)
    return old, new


def previous_flags(config):
    """serving.enableMetrics is on by default since issue 42: the first `up` after an upgrade
    rewrites each unit's ExecStart and restarts its server once (docs/choosing-a-strategy.md,
    "Following the traffic"). Here the operator keeps the previous flags, so what is left to see is the
    program's own change: none."""
    config["gpu-serving:serving"]["value"]["enableMetrics"] = False


def dynamic_types(stack: auto.Stack) -> dict[str, str]:
    """{name: type} of the stack's dynamic resources, from its state."""
    return {r["urn"].rsplit("::", 1)[-1]: r["type"] for r in stack.export_stack().deployment["resources"]
            if r["type"].startswith("pulumi-python:")}


def main_pid(d, stack: str) -> str:
    return d.sh(f"systemctl show -p MainPID --value {UNIT.format(stack)}").strip()


def test_previous_program_deploys_pp8_then_tp8(upgrade):
    old, _ = upgrade
    for stack in ("pp8", "tp8"):
        result = old.stack(stack).up(on_output=print)
        assert result.outputs["readiness"].value["status"] == "ready", result.outputs["readiness"].value
    # The previous program's token, which this program's aliases must find.
    assert set(dynamic_types(old.stack("tp8")).values()) == {PREVIOUS_TYPE}, (
        "PREVIOUS_PROGRAM already has the own type tokens: the alias is no longer exercised here")
    assert old.sh(f"systemctl is-active {UNIT.format('tp8')}").strip() == "active"
    assert old.sh(f"systemctl is-active {UNIT.format('pp8')}").strip() == "inactive"


def test_this_program_destroys_a_stack_only_the_previous_one_touched(upgrade):
    old, new = upgrade
    serving = main_pid(new, "tp8")
    carry_salt(old, new, "pp8")
    new.stack("pp8").destroy(on_output=print)
    units = new.sh("ls /etc/systemd/system/")
    assert UNIT.format("pp8") not in units and UNIT.format("tp8") in units
    assert main_pid(new, "tp8") == serving  # the sibling that serves was not touched


def test_this_program_refreshes_the_previous_state(upgrade):
    old, new = upgrade
    carry_salt(old, new, "tp8")
    steps = Steps()
    result = new.stack("tp8").refresh(on_output=print, on_event=steps)
    changes = {k: v for k, v in (result.summary.resource_changes or {}).items() if k != "same"}
    # A refresh that read the host as the previous program left it finds nothing to record.
    assert changes == {}, (changes, steps.seen)
    assert steps.with_op("refresh"), steps.seen  # it did read every resource


def test_preview_plans_no_change_on_the_previous_state(upgrade):
    _, new = upgrade
    stack = new.stack("tp8")
    deployed = {r["urn"].rsplit("::", 1)[-1] for r in stack.export_stack().deployment["resources"]}
    steps = Steps()
    preview = stack.preview(diff=True, on_output=print, on_event=steps)
    # Every deployed resource was planned (by name: an aliased new type token changes the URN).
    assert deployed <= {urn.rsplit("::", 1)[-1] for _, urn in steps.seen}, (deployed, steps.seen)
    assert not steps.with_op(*DESTRUCTIVE), steps.with_op(*DESTRUCTIVE)
    # Nothing updates either: same inputs, same providers, same outputs.
    assert not steps.with_op("update"), (steps.with_op("update"), preview.stdout[-3000:])
    assert steps.ops() <= {"same", "refresh"}, steps.seen


def test_up_replaces_nothing_and_keeps_the_server_running(upgrade):
    _, new = upgrade
    probe = (f"systemctl show -p MainPID -p NRestarts -p ActiveEnterTimestamp {UNIT.format('tp8')}; "
             f"stat -c '%Y %a' /etc/systemd/system/{UNIT.format('tp8')} /etc/gpu-serving/kimi-k2.6.env")
    before = new.sh(probe)
    steps = Steps()
    result = new.stack("tp8").up(on_output=print, on_event=steps)
    assert not steps.with_op(*DESTRUCTIVE, "update"), steps.with_op(*DESTRUCTIVE, "update")
    assert result.outputs["readiness"].value["status_when_checked"] == "ready", result.outputs["readiness"].value
    assert new.sh(probe) == before  # same server process, no restart, files untouched
    # The up moved every resource to its own type token (the alias found it under the old one).
    assert dynamic_types(new.stack("tp8")) == {n: DYNAMIC + t for n, t in TOKENS.items()}


def test_drift_check_after_the_upgrade_is_clean_and_finds_a_hand_edit(upgrade):
    _, new = upgrade
    stack = new.stack("tp8")
    stack.preview(refresh=True, expect_no_changes=True, on_output=print)
    path = "/etc/systemd/system/" + UNIT.format("tp8")
    new.sh(f"sed -i 's/--max-running-requests 64/--max-running-requests 128/' {path}")
    with pytest.raises(auto.CommandError) as info:
        stack.preview(refresh=True, expect_no_changes=True, diff=True)
    assert "unit-file" in str(info.value) and "max-running-requests" in str(info.value)
    stack.up(refresh=True, on_output=print)
    assert "--max-running-requests 64" in new.sh(f"cat {path}")


def test_switch_to_pp8_and_back_with_this_program(upgrade):
    _, new = upgrade
    result = new.stack("pp8").up(on_output=print)
    assert result.outputs["readiness"].value["layout"]["pp_size"] == 8, result.outputs["readiness"].value
    assert new.sh(f"systemctl is-active {UNIT.format('pp8')}").strip() == "active"
    assert new.sh(f"systemctl is-active {UNIT.format('tp8')}").strip() == "inactive"
    result = new.stack("tp8").up(on_output=print)
    assert result.outputs["readiness"].value["layout"]["tp_size"] == 8
    assert new.sh(f"systemctl is-active {UNIT.format('tp8')}").strip() == "active"


def test_this_program_destroys_the_upgraded_stacks(upgrade):
    _, new = upgrade
    new.stack("pp8").destroy(on_output=print)
    new.stack("tp8").destroy(on_output=print)
    units = new.sh("ls /etc/systemd/system/")
    assert UNIT.format("tp8") not in units and UNIT.format("pp8") not in units


@pytest.fixture(scope="module")
def fleet_upgrade(tmp_path_factory, rehearsal_host_factory):
    a, b = rehearsal_host_factory(), rehearsal_host_factory()
    tmp = tmp_path_factory.mktemp("fleet-upgrade")
    source = previous_tree(tmp / "previous-tree")

    def two_hosts(config):
        config["gpu-serving:hosts"] = {"value": [{"name": "gpu1", "rehearsal": a.name},
                                                 {"name": "gpu2", "rehearsal": b.name}]}
    old = make_deployment(tmp, a, source=source, name="previous")
    new = make_deployment(tmp, a)
    for d in (old, new):
        d.edit_project(two_hosts)
    new.edit_project(previous_flags)
    return old, new, {"gpu1": a, "gpu2": b}


def test_fleet_deployed_by_the_previous_program_upgrades_in_place(fleet_upgrade):
    """A fleet stack (gpu-serving:hosts): the per-host resources (gpu1-service, ...) are taken
    over the same way, on every host."""
    old, new, hosts = fleet_upgrade
    old.stack("tp8").up(on_output=print)
    pid = f"systemctl show -p MainPID -p NRestarts --value {UNIT.format('tp8')}"
    before = {name: h.run(pid).stdout for name, h in hosts.items()}
    assert all(p.split()[0] != "0" for p in before.values()), before
    carry_salt(old, new, "tp8")
    steps = Steps()
    new.stack("tp8").up(on_output=print, on_event=steps)
    assert {urn.rsplit("::", 1)[-1] for _, urn in steps.seen} >= {"gpu1-service", "gpu2-service"}, steps.seen
    assert not steps.with_op(*DESTRUCTIVE, "update"), steps.with_op(*DESTRUCTIVE, "update")
    assert {name: h.run(pid).stdout for name, h in hosts.items()} == before
    types = dynamic_types(new.stack("tp8"))
    assert types == {f"{h}-{n.removeprefix('host-')}": DYNAMIC + t for h in hosts for n, t in TOKENS.items()}, types
    new.stack("tp8").preview(refresh=True, expect_no_changes=True, on_output=print)
    new.stack("tp8").destroy(on_output=print)
    for h in hosts.values():
        assert UNIT.format("tp8") not in h.run("ls /etc/systemd/system/").stdout
