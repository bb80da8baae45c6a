"""Talking to SGLang's router (smg) and to a server being rolled: the admin API, called on the
router's own host through its venv's python over SSH (the key goes on stdin, never on a command
line), and the in-flight count of a server read on its host. The decisions are pure, in
components/core/router.py.

A host's place in a roll (`membership`): out of the router, drained, switched by the caller (the
existing single-host switch), then back in the router and healthy, whatever the switch did.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
from typing import Callable, Iterator, Optional

from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from ..core import router as R
from ..core.specs import ServiceSpec
from ..core.specs_router import RouterAdminAccess, RouterReadinessSpec, RouterServiceSpec
from . import identity, ssh
from .common import changed as _changed
from .common import progress as _progress
from .common import require_target as _require_target
from .common import resource_id
from .common import stop_and_disable as _stop_and_disable

ADMIN_TIMEOUT = 30
POLL_SECONDS = 0.5


class RollError(ssh.RemoteError):
    """A roll step failed; the message names the host."""


class RouterAdmin:
    """The admin API of the router: on its own machine, called through its venv's python (the
    props of RouterAdminAccess: the router's resources', or a fleet host's `router` place)."""

    def __init__(self, props: dict):
        access = RouterAdminAccess.from_props(props)
        self.t = ssh.Target.from_props({"connection": access.connection})
        self.base = R.local_url(access.bind, access.port)
        self.python = f"{access.venv_path}/bin/python"
        self.key = access.admin_key

    def call(self, method: str, path: str, body: Optional[dict] = None) -> tuple[int, str]:
        data = (self.key + "\n" + (json.dumps(body) if body is not None else "")).encode()
        res = ssh.run(self.t, [self.python, "-c", R.HTTP_SCRIPT, method, self.base + path], input=data,
                      purpose=f"router admin {method} {path}", timeout=ADMIN_TIMEOUT, check=False, secrets=[self.key])
        if res.rc != 0:
            return 0, ssh.redact((res.stderr or res.stdout).strip()[-300:], [self.key])
        return R.parse_http(res.stdout)

    def workers(self) -> list[R.Worker]:
        status, body = self.call("GET", "/workers")
        if status != 200:
            raise ssh.RemoteError(f"the router on {self.t.label} did not list its workers (HTTP {status}): {body[:200]}")
        return R.parse_workers(body)

    def remove(self, url: str) -> None:
        for w in self.workers():
            if w.url == url:
                status, body = self.call("DELETE", f"/workers/{w.id}")
                if status not in (200, 202, 204, 404):
                    raise ssh.RemoteError(f"the router refused to remove {url} (HTTP {status}): {body[:200]}")

    def add(self, url: str, timeout: float) -> list[R.Worker]:
        """Put `url` back and wait until the router routes to it. smg finishes a removal in the
        background (the worker stays listed as draining a while): a worker added before that
        is dropped with it, so the add waits for the old entry to go, and is made again if the
        worker vanishes before it is healthy."""
        deadline = time.monotonic() + timeout
        posted = None
        while True:
            workers = self.workers()
            mine = [w for w in workers if w.url == url]
            if R.serving(mine):
                return workers
            now = time.monotonic()
            if not mine and (posted is None or now - posted > 5):
                status, body = self.call("POST", "/workers", {"url": url})
                if status not in (200, 201, 202, 409):
                    raise ssh.RemoteError(f"the router refused to add {url} (HTTP {status}): {body[:200]}")
                posted = now
            if now > deadline:
                listed = ", ".join(f"{w.url} {w.status}" for w in workers) or "no worker"
                raise ssh.RemoteError(f"the router does not report {url} healthy within {timeout:g} s (it lists {listed})")
            time.sleep(POLL_SECONDS)

    def wait(self, what: str, done: Callable[[list[R.Worker]], bool], timeout: float) -> list[R.Worker]:
        deadline = time.monotonic() + timeout
        while True:
            workers = self.workers()
            if done(workers):
                return workers
            if time.monotonic() > deadline:
                listed = ", ".join(f"{w.url} {w.status}" for w in workers) or "no worker"
                raise ssh.RemoteError(f"{what} within {timeout:g} s (the router lists {listed})")
            time.sleep(POLL_SECONDS)


def in_flight(t: ssh.Target, bind: str, port: int) -> Optional[int]:
    """Requests running or waiting on the server of `t` (SGLang's /get_load, else /metrics)."""
    for path, parse in (("/get_load", R.in_flight_from_load), ("/metrics", R.in_flight)):
        res = ssh.run(t, ["python3", "-c", R.HTTP_SCRIPT, "GET", R.local_url(bind, port) + path], input=b"\n",
                      purpose=f"reading {path}", timeout=ADMIN_TIMEOUT, check=False, read=True)
        status, body = R.parse_http(res.stdout) if res.rc == 0 else (0, "")
        if status == 200:
            n = parse(body)
            if n is not None:
                return n
    return None


def drain(t: ssh.Target, bind: str, port: int, timeout: float, progress: Callable[[str], None], who: str) -> None:
    """Wait until the server has no request in flight (bounded). A server that reports no load
    at all (it is not running) has nothing to drain."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        n = in_flight(t, bind, port)
        if not n:
            return
        if n != last:
            progress(f"{who}waiting for {n} request(s) in flight to finish")
            last = n
        if time.monotonic() > deadline:
            raise RollError(f"{t.label} still had {n} request(s) in flight {timeout:g} s after it left the router "
                            "(gpu-serving:rollout.drainTimeoutSeconds)")
        time.sleep(POLL_SECONDS)


def _take_out(admin: RouterAdmin, url: str) -> None:
    admin.remove(url)
    # smg keeps a removed worker listed as draining for a fixed delay; it routes nothing to it.
    admin.wait(f"the router still routes to {url}", lambda ws: all(w.url != url for w in R.serving(ws)), 60)


def _place(spec: ServiceSpec):
    if spec.router is None:
        raise ValueError(f"{spec.unit} has no place behind a router")
    return spec.router


def _drain(t: ssh.Target, spec: ServiceSpec, progress: Callable[[str], None], who: str) -> None:
    drain(t, spec.bind, spec.port, _place(spec).drain_timeout, progress, who)


def leave(t: ssh.Target, spec: ServiceSpec, progress: Callable[[str], None], who: str) -> None:
    """A server about to stop for good (its host left the fleet, its stack destroyed, its unit
    moved): out of the router, then drained, so no request through the router meets it stopped."""
    place = _place(spec)
    progress(f"{who}taking {place.worker_url} out of the router before it stops")
    _take_out(RouterAdmin(place.admin()), place.worker_url)
    _drain(t, spec, progress, who)


def ensure_listed(spec: ServiceSpec, progress: Callable[[str], None], who: str) -> None:
    """A server that serves without having been switched (a host that joined the fleet already
    serving, or one the router no longer lists) is put in the router and waited for."""
    place = _place(spec)
    admin, url = RouterAdmin(place.admin()), place.worker_url
    if any(w.url == url for w in R.serving(admin.workers())):
        return
    progress(f"{who}putting {url} in the router")
    admin.add(url, place.ready_timeout)
    progress(f"{who}{url} is in the router and healthy")


@contextlib.contextmanager
def membership(t: ssh.Target, spec: ServiceSpec, progress: Callable[[str], None], who: str) -> Iterator[None]:
    """The host's turn in a roll around the caller's switch: out of the router, drained; then
    (after the switch, or after its failure and rollback) back in and healthy (spec.router: the
    router's admin access, this server's URL there, the drain and ready bounds)."""
    place = _place(spec)
    admin, url = RouterAdmin(place.admin()), place.worker_url
    # The roll was planned never to take the last server out (core/roll.py); checked again at the
    # host's turn, since servers may have gone since the plan read them.
    now = R.serving(admin.workers())
    if [w.url for w in now] == [url]:
        raise RollError(f"{who}the roll stops before taking {url} out of the router: it is the only server the router "
                        "sends requests to now (the others left it or became unhealthy since the roll was planned)")
    progress(f"{who}roll: taking {url} out of the router")
    _take_out(admin, url)
    failure: Optional[BaseException] = None
    try:
        _drain(t, spec, progress, who)
        progress(f"{who}roll: drained; switching")
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        # Back in the router whatever happened: after a failure the host serves its previous
        # strategy again (the switch rolled it back), and the roll stops with the caller's error.
        progress(f"{who}roll: putting {url} back in the router")
        try:
            admin.add(url, place.ready_timeout)
            progress(f"{who}roll: {url} is back in the router and healthy")
        except ssh.RemoteError as exc:
            if failure is None:
                raise RollError(f"{t.label} switched but is not back in the router: {exc}") from None
            progress(f"{who}roll: {url} could not be put back in the router: {exc}")


# ---------------------------------------------------------------------------------------------
# The router's service and its readiness (dynamic providers; pickled by this module path)

@identity.guarded
class RouterServiceProvider(ResourceProvider):
    """The router's unit: enabled and active, restarted when its unit text changed, ready when
    its admin API answers (it lists its workers). props: RouterServiceSpec (connection, unit,
    unitText, bind, port, venvPath, adminKey). Outputs: active, enabled (read back: a stopped
    router is drift)."""

    def _state(self, t: ssh.Target, unit: str) -> dict[str, str]:
        out = ssh.run(t, ["systemctl", "show", "-p", "ActiveState", "-p", "UnitFileState", "--", unit],
                      purpose=f"reading {unit}'s state", timeout=ADMIN_TIMEOUT, check=False, read=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    @staticmethod
    def _marker(props: dict) -> tuple[str, bytes]:
        """Where the router's start is recorded, and what it ran with (the unit text and the key's
        hash): a router already running this declaration is not restarted, so a second strategy
        stack, or an `up` that changes nothing of the router, never interrupts its requests."""
        spec = RouterServiceSpec.from_props(props)
        digest = hashlib.sha256(spec.unit_text.encode() + b"\0" + hashlib.sha256(str(spec.access.admin_key).encode()).digest())
        return f"/run/gpu-serving/{spec.unit}.started", digest.hexdigest().encode()

    def _converge(self, props: dict) -> dict:
        t = _require_target(props)
        spec = RouterServiceSpec.from_props(props)
        unit = spec.unit
        path, want = self._marker(props)
        running = self._state(t, unit).get("ActiveState") == "active"
        if running and ssh.read_file(t, path) == want:
            _progress(f"router: {unit} runs as declared; not restarted")
            state = self._state(t, unit)
            return {**props, "active": True, "enabled": state.get("UnitFileState") == "enabled"}
        ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120)
        ssh.run(t, ["systemctl", "enable", "--quiet", unit], purpose=f"enabling {unit}", timeout=60)
        action = "restart" if running else "start"
        _progress(f"router: {action} {unit}")
        ssh.run(t, ["systemctl", action, unit], purpose=f"{action} {unit}", timeout=120)
        ssh.run(t, ["mkdir", "-p", "/run/gpu-serving"], purpose="creating /run/gpu-serving", timeout=ADMIN_TIMEOUT)
        ssh.write_file(t, path, want, 0o600)
        admin = RouterAdmin(props)
        deadline = time.monotonic() + 60
        while True:
            status, body = admin.call("GET", "/workers")
            if status == 200:
                break
            if time.monotonic() > deadline or self._state(t, unit).get("ActiveState") == "failed":
                journal = ssh.run(t, ["journalctl", "-u", unit, "-n", "20", "--no-pager", "-o", "cat"],
                                  purpose=f"reading {unit}'s journal", timeout=ADMIN_TIMEOUT, check=False, read=True).stdout
                raise ssh.RemoteError(f"the router {unit} on {t.label} does not answer its admin API (HTTP {status}: "
                                      f"{body[:200]}).\nLast lines of journalctl -u {unit}:\n"
                                      + ssh.redact(journal, [str(spec.access.admin_key)]))
            time.sleep(POLL_SECONDS)
        state = self._state(t, unit)
        return {**props, "active": state.get("ActiveState") == "active", "enabled": state.get("UnitFileState") == "enabled"}

    def create(self, props):
        return CreateResult(id_=resource_id(props, RouterServiceSpec.from_props(props).unit), outs=self._converge(props))

    @staticmethod
    def _elsewhere(olds: dict, news: dict) -> str:
        """"moved" (another machine), "renamed" (another unit on the same machine) or "": the
        router the state recorded is not the one declared, and is retired by the update."""
        if ssh.another_machine(olds.get("connection"), news.get("connection")):
            return "moved"
        return "renamed" if olds.get("unit") and olds.get("unit") != news.get("unit") else ""

    def update(self, id, olds, news):
        # An update, not a replace: the router's resources are kept on delete (every strategy
        # stack of the fleet declares the same router), so a replace would leave the old router
        # running, enabled and forgotten. The update retires it itself, which also holds for a
        # state written when the router's files were kept the same way.
        elsewhere = self._elsewhere(olds, news)
        if elsewhere == "renamed":
            self._retire(olds, "renamed")  # first: the two would listen on the same port
        outs = (None if elsewhere else self._refleet(olds, news)) or self._converge(news)
        if elsewhere == "moved":
            self._retire(olds, "moved")  # after: the new router answers before the old one stops
        return UpdateResult(outs=outs)

    @staticmethod
    def _fleet_only(olds: dict, news: dict) -> bool:
        """Only the fleet behind the router changed (which servers it routes to)."""
        return (olds.get("adminKey") == news.get("adminKey") and olds.get("unitText") != news.get("unitText")
                and R.without_workers(str(olds.get("unitText"))) == R.without_workers(str(news.get("unitText"))))

    def _refleet(self, olds: dict, news: dict) -> Optional[dict]:
        """A host joined or left the fleet, and nothing else of the router changed: a restart would
        drop every request through it, so the running router is told through its admin API. The
        servers that left are taken out here (their own delete drains and stops them later in the
        run); the ones that joined are put in by their own start, once they serve. The unit file,
        already rewritten, gives the whole fleet to the router's next start. None: the router does
        not run the state's declaration, so it is started or restarted as ever."""
        if not self._fleet_only(olds, news):
            return None
        t = _require_target(news)
        spec = RouterServiceSpec.from_props(news)
        unit = spec.unit
        path, running_as = self._marker(olds)
        state = self._state(t, unit)
        if state.get("ActiveState") != "active" or ssh.read_file(t, path) != running_as:
            return None
        admin = RouterAdmin(news)
        declared = R.worker_urls(spec.unit_text)
        for url in sorted({w.url for w in admin.workers()} - set(declared)):
            _progress(f"router: taking {url} out of the router: it left the fleet")
            admin.remove(url)
        ssh.write_file(t, path, self._marker(news)[1], 0o600)
        _progress(f"router: {unit} routes to the fleet as declared ({len(declared)} server(s)); not restarted")
        # The state read above still holds: the admin API changes which servers it routes to, not the unit.
        return {**news, "active": True, "enabled": state.get("UnitFileState") == "enabled"}

    def _retire(self, olds: dict, why: str) -> None:
        """Stop and disable the router the state recorded, and remove its unit file, environment
        file (its admin key) and start record there; its venv stays, like the serving venvs."""
        unit, c = RouterServiceSpec.from_props(olds).unit, olds.get("connection") or {}
        if identity.left_behind(olds):
            _progress(f"router: warning: {unit} is left on {c.get('host')}, which does not answer: if it comes back it "
                      f"starts {unit} at boot; run `systemctl disable --now {unit}` there")
            return
        t = _require_target(olds, stored=True)
        _stop_and_disable(t, unit)
        for path in (R.unit_file_of(unit), R.environment_path_of(unit), self._marker(olds)[0]):
            ssh.remove_file(t, path)
        ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120)
        where = "" if why == "renamed" else f" on {c.get('host')}"
        _progress(f"router: {unit} stopped and disabled{where}, its unit file and environment file removed")

    def read(self, id, props):
        state = self._state(_require_target(props), RouterServiceSpec.from_props(props).unit)
        outs = {**props, "active": state.get("ActiveState") == "active", "enabled": state.get("UnitFileState") == "enabled"}
        return ReadResult(id_=id, outs=outs, inputs={k: v for k, v in outs.items() if k not in ("active", "enabled")})

    def diff(self, id, olds, news):
        changed = _changed(olds, news, list(RouterServiceSpec.DIFFED))
        if olds.get("active") is False or olds.get("enabled") is False:
            changed.append("active")
        # Said at the diff, so the preview says it before anything happens.
        elsewhere = self._elsewhere(olds, news)
        if elsewhere == "moved":
            _progress(f"router: {news.get('unit')} moves from {olds['connection'].get('host')} to "
                      f"{news['connection'].get('host')}: it starts there and is checked, then it is stopped and "
                      "disabled where it ran, its unit file and environment file removed (its venv stays)")
        elif self._fleet_only(olds, news) and olds.get("active") is not False:
            before, after = R.worker_urls(str(olds.get("unitText"))), R.worker_urls(str(news.get("unitText")))
            joins, leaves = [u for u in after if u not in before], [u for u in before if u not in after]
            _progress("router: the fleet behind it changes (" + "; ".join(
                part for part in (f"joins: {', '.join(joins)}" if joins else "", f"leaves: {', '.join(leaves)}" if leaves else "")
                if part) + "): the router is told through its admin API, not restarted")
        elif elsewhere == "renamed":
            _progress(f"router: {olds['unit']} is renamed {news.get('unit')}: {olds['unit']} is stopped, disabled and "
                      f"its files removed before {news.get('unit')} starts (both would listen on port {news.get('port')}); "
                      "the router does not answer in between")
        return DiffResult(changes=bool(changed), replaces=[], stables=[], delete_before_replace=False)

    def delete(self, id, props):
        t = _require_target(props, stored=True)
        unit = RouterServiceSpec.from_props(props).unit
        ssh.run(t, ["systemctl", "disable", "--now", "--quiet", unit], purpose=f"stopping {unit}", timeout=120, check=False)


@identity.guarded
class RouterReadinessProvider(ResourceProvider):
    """Ready when the router lists every declared worker as healthy and ready. props:
    RouterReadinessSpec (connection, bind, port, venvPath, adminKey, expected: worker URLs, names:
    {url: host name}, timeoutSeconds). Outputs: status, reason, workers ([{host, url, status,
    strategy}])."""

    def _check(self, props: dict, wait: bool) -> dict:
        spec = RouterReadinessSpec.from_props(props)
        admin = RouterAdmin(props)
        expected = list(spec.expected)
        deadline = time.monotonic() + (spec.timeout_seconds if wait else 0)
        while True:
            try:
                workers, error = admin.workers(), ""
            except (ssh.RemoteError, ValueError) as exc:
                workers, error = None, str(exc)
            verdict = R.judge_router(expected, workers, error)
            if verdict.ready or time.monotonic() > deadline:
                break
            time.sleep(POLL_SECONDS)
        names = spec.names
        listed = [{"host": names.get(w.url, ""), "url": w.url, "status": w.status if w.healthy else f"{w.status} (unhealthy)",
                   "strategy": w.strategy} for w in workers or []]
        if wait and not verdict.ready:
            raise ssh.RemoteError(f"router readiness: {verdict.reason}")
        return {**props, "status": "ready" if verdict.ready else "not ready", "reason": verdict.reason, "workers": listed}

    def create(self, props):
        port = RouterReadinessSpec.from_props(props).access.port  # the router's own port
        return CreateResult(id_=resource_id(props, str(port), "router"), outs=self._check(props, wait=True))

    def update(self, id, olds, news):
        return UpdateResult(outs=self._check(news, wait=True))

    def read(self, id, props):
        outs = self._check(props, wait=False)
        return ReadResult(id_=id, outs=outs, inputs={k: v for k, v in outs.items() if k not in ("status", "reason", "workers")})

    def diff(self, id, olds, news):
        changed = _changed(olds, news, list(RouterReadinessSpec.DIFFED))
        if olds.get("status") != "ready":
            changed.append("status")
        return DiffResult(changes=bool(changed), replaces=[], stables=[], delete_before_replace=False)

    def delete(self, id, props):
        """Nothing: a check."""
