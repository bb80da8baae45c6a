"""The one delete hook of the serving units (components/serving_unit.py): registered under one
name whatever the fleet, so a run that removes a gpu-serving:hosts entry finds the hook its state
names; what it says in a preview for a declared host and for a removed one."""
from __future__ import annotations

import pulumi
import pytest

from components import serving_unit
from components.core import status as S


class Args:
    def __init__(self, name: str, id: str, outputs: dict):
        self.name, self.id, self.old_outputs, self.urn = name, id, outputs, f"urn:...::{name}"


SERVING = {"active": True, "runningServer": "as declared", "unit": "sglang-kimi-k2.6-tp8.service", "stack": "tp8"}


@pytest.fixture
def warned(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: True)
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **kw: said.append(message))
    serving_unit.begin_run()
    yield said
    serving_unit.begin_run()


def test_a_removed_fleet_entrys_unit_is_said_to_stop_from_its_state(warned):
    serving_unit._destroy_warning(Args("gpu3-service", "10.213.3.2:sglang-kimi-k2.6-tp8.service", SERVING))
    assert warned == ["hosts[gpu3] (10.213.3.2) is no longer in gpu-serving:hosts: stack tp8's sglang-kimi-k2.6-tp8.service, "
                      "which serves there now (as this run's refresh read it), is stopped and removed; nothing of stack "
                      "tp8 will serve there afterwards."]


def test_a_removed_entry_that_did_not_serve_says_nothing(warned):
    serving_unit._destroy_warning(Args("gpu3-service", "10.213.3.2:u.service", {**SERVING, "active": False}))
    assert warned == []


def test_nothing_is_said_outside_a_preview(warned, monkeypatch):
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: False)
    serving_unit._destroy_warning(Args("gpu3-service", "10.213.3.2:u.service", SERVING))
    assert warned == []


def test_the_removed_wording_is_the_status_modules():
    said = S.destroy_warning(unit="u.service", stack="ep8", where="hosts[gpu2] (h)", outputs=SERVING, removed=True)
    assert said.startswith("hosts[gpu2] (h) is no longer in gpu-serving:hosts")
    assert S.destroy_warning(unit="u.service", stack="ep8", where="h", outputs={"active": False}, removed=True) is None


def test_one_shared_name_and_the_names_older_fleet_states_recorded(warned, monkeypatch):
    registered: list[str] = []

    class Hook:
        def __init__(self, name, callback, options):
            registered.append(name)
            self.name = name
    monkeypatch.setattr(pulumi, "ResourceHook", Hook)
    bound = [serving_unit._destroy_warning_hook(f"{p}service", p, "plan", "host") for p in ("gpu1-", "gpu2-")]
    assert [h.name for h in bound] == [serving_unit.DESTROY_HOOK] * 2
    assert registered == [serving_unit.DESTROY_HOOK, f"gpu1-{serving_unit.DESTROY_HOOK}", f"gpu2-{serving_unit.DESTROY_HOOK}"]
    serving_unit.begin_run()
    registered.clear()
    serving_unit._destroy_warning_hook("service", "", "plan", "host")  # one host: its name was always the shared one
    assert registered == [serving_unit.DESTROY_HOOK]
