"""A host joining or leaving a fleet behind the router: the running router is told through its
admin API, never restarted (a restart drops every request through it); a server that stops for
good leaves the router and drains first; one that serves without a switch is put in. The
providers over a recorded fake transport and a fake admin API; the real smg in
tests/e2e/test_router_roll.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.core import router as R
from components.core.config import parse_settings
from components.core.specs import ServiceSpec
from components.remote import host_lock, providers, service_state, ssh, switch_executor
from components.remote import router as remote

DATA = Path(__file__).parent / "data" / "router"
URLS = ["http://10.0.0.11:30001", "http://10.0.0.12:30001", "http://[fd00::13]:30001"]


def unit(workers: list[str], **router) -> str:
    doc = yaml.safe_load((DATA / "unit-fleet-3.yaml").read_text())
    doc["config"]["router"] = {**doc["config"]["router"], **router}
    return R.render_unit(parse_settings("tp8", {**doc["config"], "strategy": {"tpSize": 8}}), workers)


def test_the_unit_but_for_its_fleet_and_the_fleet_it_names():
    three, two = unit(URLS), unit(URLS[:2])
    assert R.worker_urls(three) == URLS and R.worker_urls(two) == URLS[:2]
    assert R.without_workers(three) == R.without_workers(two) and three != two
    assert R.without_workers(unit(URLS, port=30081)) != R.without_workers(three)
    assert R.worker_urls((DATA / "unit-fleet-3.service").read_text()) == URLS


def props(workers: list[str], key: str = "admin-key-0123456789", **router) -> dict:
    return {"connection": {"host": "10.0.0.11", "port": 22, "user": "root", "privateKey": "k", "hostKey": "ssh-ed25519 AAAA"},
            "unit": "gpu-serving-router.service", "unitText": unit(workers, **router), "bind": "0.0.0.0", "port": 30080,
            "venvPath": "/opt/gpu-serving/router", "adminKey": key, "active": True, "enabled": True}


class Host:
    """The router's host: its unit's state, its start record, the admin API's workers."""

    def __init__(self, monkeypatch, running: dict, listed: list[str], active: str = "active"):
        self.done: list = []
        self.files = {remote.RouterServiceProvider._marker(running)[0]: remote.RouterServiceProvider._marker(running)[1]}
        self.listed = list(listed)
        monkeypatch.setattr(remote.RouterServiceProvider, "_state",
                            lambda _, t, u: {"ActiveState": active, "UnitFileState": "enabled"})
        monkeypatch.setattr(remote.RouterServiceProvider, "_converge",
                            lambda _, p: self.done.append("restart") or dict(p))
        monkeypatch.setattr(ssh, "read_file", lambda t, path: self.files.get(path))
        monkeypatch.setattr(ssh, "write_file", lambda t, path, data, mode: self.files.__setitem__(path, data))
        monkeypatch.setattr(remote.RouterAdmin, "workers", lambda _: [
            R.Worker(id=str(i), url=u, status="ready", healthy=True, load=0, strategy="tp8 pp1 dp1")
            for i, u in enumerate(self.listed)])

        def remove(_, url):
            self.done.append(("remove", url))
            self.listed.remove(url)
        monkeypatch.setattr(remote.RouterAdmin, "remove", remove)
        monkeypatch.setattr(remote.RouterAdmin, "add", lambda _, url, timeout: self.done.append(("add", url)))


def test_a_host_leaving_the_fleet_is_taken_out_of_the_running_router_which_is_not_restarted(monkeypatch, capsys):
    old, new = props(URLS), props(URLS[:2])
    host = Host(monkeypatch, running=old, listed=URLS)
    provider = remote.RouterServiceProvider()
    provider.diff("id", old, new)
    assert ("router: the fleet behind it changes (leaves: http://[fd00::13]:30001): the router is told through its admin "
            "API, not restarted") in capsys.readouterr().err
    outs = provider.update("id", old, new).outs
    assert host.done == [("remove", URLS[2])]
    # The start record now says the new declaration: the next run finds it running as declared.
    path, want = provider._marker(new)
    assert host.files[path] == want and outs["active"] is True


def test_a_host_joining_is_left_to_its_own_start_and_nothing_is_restarted(monkeypatch):
    old, new = props(URLS[:2]), props(URLS)
    host = Host(monkeypatch, running=old, listed=URLS[:2])
    remote.RouterServiceProvider().update("id", old, new)
    assert host.done == []


@pytest.mark.parametrize("what, running, active, new", [
    ("the router runs another declaration", props(URLS, port=30081), "active", props(URLS[:2])),
    ("the router is stopped", props(URLS), "inactive", props(URLS[:2])),
    ("the key changes too", props(URLS), "active", props(URLS[:2], key="another-admin-key-0123")),
    ("another port too", props(URLS), "active", props(URLS[:2], port=30081)),
])
def test_anything_else_starts_or_restarts_it_as_ever(monkeypatch, what, running, active, new):
    host = Host(monkeypatch, running=running, listed=URLS, active=active)
    remote.RouterServiceProvider().update("id", props(URLS), new)
    assert host.done == ["restart"], what


# --- the serving hosts' side ------------------------------------------------------------------

def serving(router: bool = True) -> dict:
    p = {"connection": {"host": "10.0.0.13", "port": 22, "user": "root", "privateKey": "k", "hostKey": "ssh-ed25519 AAAA"},
         "unit": "sglang-kimi-k2.6-tp8.service", "bind": "0.0.0.0", "port": 30001, "hostEntry": "gpu3"}
    if router:
        p["router"] = {"connection": props(URLS)["connection"], "bind": "0.0.0.0", "port": 30080,
                       "venvPath": "/opt/gpu-serving/router", "adminKey": "admin-key-0123456789", "workerUrl": URLS[2],
                       "drainTimeout": 60, "readyTimeout": 90}
    return p


@pytest.fixture
def deleting(monkeypatch):
    steps: list = []
    monkeypatch.setattr(service_state, "show", lambda t, units: {units[0]: {"ActiveState": "active"}})
    monkeypatch.setattr(ssh, "run", lambda t, argv, **kw: steps.append(" ".join(argv)))
    monkeypatch.setattr(remote, "leave", lambda t, p, progress, who: steps.append("leave router"))
    return steps


def test_a_server_stopping_for_good_leaves_the_router_and_drains_first(deleting):
    providers.ServiceProvider().delete("id", serving())
    assert deleting == ["leave router", "systemctl disable --now sglang-kimi-k2.6-tp8.service"]


def test_without_a_router_it_only_stops(deleting):
    providers.ServiceProvider().delete("id", serving(router=False))
    assert deleting == ["systemctl disable --now sglang-kimi-k2.6-tp8.service"]


def test_a_unit_that_does_not_serve_leaves_the_router_alone(monkeypatch, deleting):
    """Another strategy stack's unit, destroyed while the host serves: the router keeps the host's
    URL, which the serving unit answers."""
    monkeypatch.setattr(service_state, "show", lambda t, units: {units[0]: {"ActiveState": "inactive"}})
    providers.ServiceProvider().delete("id", serving())
    assert deleting == ["systemctl disable --now sglang-kimi-k2.6-tp8.service"]


def test_a_router_that_cannot_be_told_does_not_keep_the_server_running(monkeypatch, deleting, capsys):
    def unreachable(*a):
        raise ssh.RemoteError("the router on root@10.0.0.11:22 did not list its workers (HTTP 0)")
    monkeypatch.setattr(remote, "leave", unreachable)
    providers.ServiceProvider().delete("id", serving())
    assert deleting == ["systemctl disable --now sglang-kimi-k2.6-tp8.service"]
    assert "could not be taken out of the router first" in capsys.readouterr().err


@pytest.mark.parametrize("listed, done", [(URLS, []), (URLS[:2], [("add", URLS[2])])], ids=["listed", "not listed"])
def test_a_server_serving_without_a_switch_is_put_in_the_router_when_it_is_not_there(monkeypatch, listed, done):
    host = Host(monkeypatch, running=props(URLS), listed=listed)
    remote.ensure_listed(ServiceSpec.from_props(serving()), lambda m: None, "hosts[gpu3]: ")
    assert host.done == done


def test_a_roll_never_takes_the_last_server_out_of_the_router(monkeypatch):
    """Issue 36.5, at the host's turn: the plan said others serve, but they have gone since; the roll
    stops before this host leaves the router. With another server there, it goes out as planned."""
    host = Host(monkeypatch, running=props(URLS), listed=[URLS[2]])
    with pytest.raises(remote.RollError, match=r"the roll stops before taking http://\[fd00::13\]:30001 out of the router: "
                                               "it is the only server"):
        with remote.membership(None, ServiceSpec.from_props(serving()), lambda m: None, "hosts[gpu3]: "):
            raise AssertionError("switched")
    assert host.done == []
    host = Host(monkeypatch, running=props(URLS), listed=URLS[1:])
    monkeypatch.setattr(remote, "_drain", lambda *a: None)
    monkeypatch.setattr(remote.RouterAdmin, "wait", lambda *a: [])
    with remote.membership(None, ServiceSpec.from_props(serving()), lambda m: None, "hosts[gpu3]: "):
        host.done.append("switched")
    assert host.done == [("remove", URLS[2]), "switched", ("add", URLS[2])]


def test_a_host_serving_as_declared_but_out_of_the_router_is_an_update_that_puts_it_back(monkeypatch):
    """core/roll.py's `rejoin`: the program marks such a host's router props; its service then has
    a change (an update, no restart: why_restart says none), whose start puts it in the router."""
    declared = {**serving(), "configHash": "h", "execStart": "x", "environment": {}, "declared": {}, "active": True,
                "enabled": True, "runningServer": "as declared", "readinessReport": {"checked_at": ""}}
    same = providers.ServiceProvider().diff("id", declared, declared)
    assert same.changes is False
    back = providers.ServiceProvider().diff("id", declared, {**declared, "router": {**declared["router"], "rejoin": True}})
    assert back.changes is True and back.replaces == []
    host = Host(monkeypatch, running=props(URLS), listed=URLS[:2])
    monkeypatch.setattr(service_state, "serving", lambda t, unit: True)
    monkeypatch.setattr(switch_executor.Switch, "switch", lambda self, restart=None: {"restart": self.restart})
    monkeypatch.setattr(host_lock, "acquire", lambda t, wait=0: None)
    monkeypatch.setattr(ssh, "one_connection", lambda t, during: __import__("contextlib").nullcontext())
    outs = providers.ServiceProvider()._start({**declared, "router": {**declared["router"], "rejoin": True}}, restart=False)
    assert outs["restart"] is False and host.done == [("add", URLS[2])]
