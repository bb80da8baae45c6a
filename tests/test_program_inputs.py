"""What the program hands the engine, frozen: every resource's type, name and inputs (the pickled
provider too) for each shipped stack shape, as the mocks record them (issue 37, step 1).

Deployed stacks hold these inputs; the engine diffs the next run's against them. A change of key,
default or shape is an update (or a replace) of every deployed stack, so it must be a decision,
not a side effect of moving code: the typed specs (components/core/specs.py) must build exactly
these dicts. What belongs to this machine (a running rehearsal host's address and keys, or
"unavailable" without one; paths in its cache) is shown as a placeholder. Rewritten only by hand (`UPDATE_GOLDEN=1`, then review the diff).
"""
from __future__ import annotations

import json

import pytest

from tests.casedata import DATA, update_golden
from tests.test_program_mocks import FLEET, ROOT, run_program, stack_config

GOLDEN = DATA / "program-inputs"
SECRET_SIG = "4dabf18193072939515e22adb298388d"  # Pulumi's marker of a secret value in mocks' inputs

# A stack shape: (stack file, config replaced or added over it).
SHAPES = {
    "tp8": ("tp8", {}),
    "pp8": ("pp8", {}),
    "ep8": ("ep8", {}),
    "ep8-fleet-of-two": ("ep8", {"gpu-serving:hosts": FLEET}),
    "tp8x2-behind-the-router": ("tp8x2", {"gpu-serving:routerAdminKey": "k" * 32}),
    "tp16x2-multi-node": ("tp16x2", {}),
}


def _plain(value):
    """Inputs as the engine stores them: a secret as its value, marked."""
    if isinstance(value, dict) and SECRET_SIG in value:
        return {"secret": _plain(value.get("value"))}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# Values of this machine, not of the stack: its rehearsal hosts' connections, and paths on its disk
# (the cache root, the rehearsal engine's wheelhouse named by a hash of its sources), the key its
# rehearsal CUDA repository was signed with.
OF_THIS_MACHINE = {"connection": "<connection>", "localDir": "<this machine's path>", "keyringFile": "<this machine's path>",
                   "keyringSha256": "<this machine's rehearsal CUDA key>"}


def _without_machine(value):
    """Every value of this machine (OF_THIS_MACHINE) as a placeholder; a wheelhouse's files by name
    (their hashes are of the wheels built here: the rehearsal engine's changes with its sources)."""
    if isinstance(value, dict):
        if set(value) >= {"files", "localDir", "remoteDir"} and isinstance(value["files"], dict):
            value = {**value, "files": {name: "<sha256 of the wheel built here>" for name in value["files"]}}
        return {k: (OF_THIS_MACHINE[k] if k in OF_THIS_MACHINE else _without_machine(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_machine(v) for v in value]
    return value


def recorded(shape: str, monkeypatch) -> list[dict]:
    stack, extra = SHAPES[shape]
    monkeypatch.chdir(ROOT)
    config = stack_config(stack)
    config.update({k: json.dumps(v) if not isinstance(v, str) else v for k, v in extra.items()})
    rec = run_program(stack, config, [k for k in extra if k.endswith("AdminKey")])
    # By name: the program registers through outputs, in no fixed order.
    return sorted(({"type": t, "name": n, "inputs": _without_machine(_plain(inputs))} for t, n, inputs in rec.resources),
                  key=lambda r: (r["name"], r["type"]))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_program_hands_the_engine_the_inputs_deployed_stacks_hold(shape, monkeypatch):
    got = recorded(shape, monkeypatch)
    path = GOLDEN / f"{shape}.json"
    if update_golden():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    # Resource by resource, so a failure names the one that changed.
    assert [(r["type"], r["name"]) for r in got] == [(r["type"], r["name"]) for r in want]
    for g, w in zip(got, want):
        assert g["inputs"] == w["inputs"], f"{g['type']} {g['name']}: its inputs changed (update every deployed stack?)"
