"""The drift watch, pure: one tick's findings as a document, what changed since the previous tick,
and the files an operator's monitoring reads (JSON, Prometheus text format). Cases in
tests/data/watch/.

A tick is, per stack: the steps of `pulumi preview --refresh` (each resource whose host truth
differs from the declaration), and per host: the `status` read (what serves). The two together
tell "someone switched" (another stack's unit serves: this stack is superseded) from "someone
edited" (a file or the running server of a stack differs from its declaration). A third kind is
the machine's own: **fitness drift** (the host facts' `fitnessDrift`, core/fitness_baseline.py),
the GPUs no longer as the host's benchmark measured them, which no `up` repairs: never counted
as an edit.
"""
from __future__ import annotations

import difflib
import json
import re
from functools import partial
from typing import Any, Callable, Iterable, Optional

from .errors import ConfigError, SettingError, secret_kind
from .rules import credential_name

# Steps of a preview that mean the host is not as declared ("same", "refresh", "read" do not).
DRIFT_OPS = ("update", "replace", "create", "delete")
# Inputs that never are the host's truth: which reads start ahead, the last readiness report,
# what a failed switch keeps, a checksum that follows `content`.
IGNORED_KEYS = frozenset({"prefetch", "readinessReport", "previous", "sha256", "showWhenNew", "checkedAt"})
# Inputs whose values may hold a secret or a key: named, never shown.
HIDDEN_KEYS = frozenset({"connection", "secretEnvironment", "environment", "hfToken", "privateKey"})
# What a switch by another stack changes in this stack's service and readiness resources.
SWITCH_KEYS = frozenset({"active", "enabled", "runningServer", "report", "status"})
SUPERSEDED = "superseded: "
SHORT = 120  # longest value shown in a line
MAX_LINES = 6

_EVERY = re.compile(r"[ ]*([0-9]+)[ ]*([smhd]?)[ ]*\Z")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_EVERY_SECONDS = 10


def parse_every(text: str) -> int:
    """`--every 10m` in seconds (s, m, h, d; a bare number is seconds)."""
    m = _EVERY.fullmatch(text or "")
    seconds = int(m.group(1)) * _UNITS[m.group(2)] if m else 0
    if seconds < MIN_EVERY_SECONDS:
        raise ConfigError([SettingError("--every", f"{text!r} is not an interval of at least {MIN_EVERY_SECONDS} seconds "
                                        "(a number with s, m, h or d)", "--every 10m")])
    return seconds


def parse_stacks(text: str, known: Iterable[str]) -> list[str]:
    """`--stacks tp8,pp8,ep8`: each a stack of the project (a Pulumi.<stack>.yaml), none twice."""
    known = list(known)
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    problems = []
    if not names:
        problems.append(SettingError("--stacks", "names no stack", f"--stacks {','.join(known) or 'tp8'}"))
    for n in names:
        if n not in known:
            problems.append(SettingError("--stacks", f"{n!r} has no Pulumi.{n}.yaml in the project",
                                         f"one of: {', '.join(known) or '(none: add a stack file)'}"))
    if len(set(names)) != len(names):
        problems.append(SettingError("--stacks", "names a stack twice", f"--stacks {','.join(dict.fromkeys(names))}"))
    if problems:
        raise ConfigError(problems)
    return names


# --- one resource's drift --------------------------------------------------------------------

def _short(value: Any) -> str:
    # Values as the settings and the state spell them (true, false, null), never Python's words.
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = text.replace("\n", "\\n")
    return text if len(text) <= SHORT else text[: SHORT - 3] + "..."


def _may_hold_secrets(inputs: dict[str, Any]) -> bool:
    """A file that may hold secrets (an environment file): a value of its that looks like one is
    not shown (`shown_assignment`)."""
    path = str(inputs.get("path", ""))
    return "secretEnvironment" in inputs or path.endswith(".env")


def shown_assignment(line: str) -> str:
    """An environment file's `KEY=value` line as `preview --diff` shows it (the file's plain part is
    an ordinary input there), but for a value that looks like a credential, by its name
    (rules.credential_name: HF_TOKEN, ..._API_KEY) or its form (errors.secret_kind): named only.
    The stack's own secrets never reach here: the file's provider reads them out of `content`."""
    key, sep, value = line.partition("=")
    if sep and (credential_name(key.strip()) or secret_kind(value)):
        return key + "=(value not shown)"
    return _short(line)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def line_changes(declared: str, on_host: str, *, may_hold_secrets: bool = False) -> list[str]:
    """How the host's file differs from the declared one, by line number of the file on the host."""
    a, b = declared.splitlines(), on_host.splitlines()
    out = []

    def show(line: str) -> str:
        line = line.strip()  # a continuation line's indent says nothing
        return shown_assignment(line) if may_hold_secrets else _short(line)

    def pair(on_host: str, declared: str) -> str:
        if may_hold_secrets or (len(on_host) <= SHORT and len(declared) <= SHORT):
            return f"{show(on_host)} (declared: {show(declared)})"
        # A long line (ExecStart): from a little before the first difference.
        start = max(0, len(_common_prefix(on_host, declared)) - 30)
        return f"...{_short(on_host[start:])} (declared: ...{_short(declared[start:])})"

    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace":
            for k in range(max(i2 - i1, j2 - j1)):
                old = a[i1 + k] if i1 + k < i2 else None
                new = b[j1 + k] if j1 + k < j2 else None
                if old is not None and new is not None:
                    out.append(f"line {j1 + k + 1}: {pair(new, old)}")
                elif new is not None:
                    out.append(f"line {j1 + k + 1}: added on the host: {show(new)}")
                elif old is not None:
                    out.append(f"after line {j2}: missing on the host: {show(old)}")
        elif tag == "insert":
            out += [f"line {j + 1}: added on the host: {show(b[j])}" for j in range(j1, j2)]
        else:
            out += [f"after line {j1}: missing on the host: {show(a[i])}" for i in range(i1, i2)]
    if len(out) > MAX_LINES:
        out = out[: MAX_LINES - 1] + [f"... {len(out) - MAX_LINES + 1} more changed lines"]
    return out


def resource_drift(step: dict[str, Any]) -> dict[str, Any]:
    """One preview step as the watch reports it. `step`: name, type, op, old (the inputs as the
    refresh read them from the host) and new (the declared inputs); `fitness`: the host facts'
    fitnessDrift output, when the refresh found one (the whole line: it says what to do)."""
    if step.get("fitness"):
        return {"resource": step["name"], "type": step["type"].rpartition(":")[2] or step["type"], "op": step["op"],
                "keys": ["fitnessDrift"], "lines": [str(step["fitness"])], "fitness": str(step["fitness"])}
    old, new = step.get("old") or {}, step.get("new") or {}
    keys = sorted(k for k in set(old) | set(new) if k not in IGNORED_KEYS and old.get(k) != new.get(k))
    lines: list[str] = []
    for k in keys:
        if k == "content" and isinstance(old.get(k), str) and isinstance(new.get(k), str):
            lines += line_changes(new[k], old[k], may_hold_secrets=_may_hold_secrets(new))
        elif k in HIDDEN_KEYS:
            lines.append(f"{k}: differs (values not shown)")
        elif k == "runningServer" and k in old:
            # The running server's words already say what differs from the declaration.
            lines.append(f"runningServer: {_short(old[k])}")
        elif k != "content":
            lines.append(f"{k}: {_short(old.get(k, '(not set)'))} on the host, declared {_short(new.get(k, '(not set)'))}")
    if step["op"] == "create" and not old:
        lines = ["missing on the host"]
    elif step["op"] == "delete":
        lines = ["on the host, no longer declared"]
    out = {"resource": step["name"], "type": step["type"].rpartition(":")[2] or step["type"], "op": step["op"],
           "keys": keys, "lines": lines}
    if new.get("path") or old.get("path"):
        out["file"] = new.get("path") or old.get("path")
    if isinstance(old.get("runningServer"), str) and old["runningServer"].startswith(SUPERSEDED):
        out["superseded"] = old["runningServer"]
    return out


def host_of(resource: str, hosts: list[tuple[str, str]]) -> Optional[str]:
    """The host (target) a resource of the stack belongs to: a fleet prefixes every resource of an
    entry with `<entry>-`; the one-host form has one host. None: not a host's resource."""
    if len(hosts) == 1 and not hosts[0][0]:
        return hosts[0][1]
    for entry, target in sorted(hosts, key=lambda h: -len(h[0])):
        if resource == entry or resource.startswith(f"{entry}-"):
            return target
    return None


# --- one tick --------------------------------------------------------------------------------

def _serving_of(host_doc: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    s = (host_doc or {}).get("serving")
    return {"unit": s["unit"], "stack": s.get("stack") or ""} if s else None


def tick_document(results: list[dict[str, Any]], status: dict[str, Any], *, checked_at: str, checked_at_seconds: float,
                  errors_before: int = 0) -> dict[str, Any]:
    """The tick as one document. `results`: per stack {stack, hosts: [[entry, target]], steps,
    deployed (the state holds resources), error}; `status`: `project_status`'s answer for the same stacks."""
    by_host = {h["host"]: h for h in status.get("hosts", [])}
    stacks, errors = [], 0
    for r in results:
        hosts = [tuple(h) for h in r.get("hosts", [])]
        drift: dict[Optional[str], list[dict[str, Any]]] = {}
        for step in r.get("steps", []):
            if step["op"] in DRIFT_OPS:
                item = resource_drift(step)
                drift.setdefault(host_of(step["name"], hosts), []).append(item)
        out_hosts = []
        for entry, target in hosts:
            h = by_host.get(target) or {}
            own = next((s for s in h.get("stacks", []) if s["stack"] == r["stack"]), None)
            serving = _serving_of(h)
            serving_here = bool(own and own.get("serving"))
            items = drift.get(target, []) + (drift.get(None, []) if len(hosts) == 1 else [])
            on_host = bool(own and own.get("state") != "not on this host")
            superseded = (on_host and not serving_here and serving is not None and serving["stack"] != r["stack"]) \
                or any("superseded" in i for i in items)
            fitness = [i["fitness"] for i in items if i.get("fitness")]
            items = [i for i in items if not i.get("fitness")]
            switched = [i for i in items if superseded and set(i["keys"]) <= SWITCH_KEYS and "file" not in i]
            edited = [i for i in items if i not in switched]
            error = h.get("error") or (r.get("error") if r.get("error") else None)
            readiness = (h.get("readiness") or {}).get("status") if serving_here else None
            if not r.get("deployed", True) and not error:
                edited, switched, fitness = [], [], []  # a stack never deployed: nothing of it to drift
            state = ("unreachable" if error else "not deployed" if not r.get("deployed", True)
                     else "drifted" if edited else "superseded" if superseded else "fitness drift" if fitness else "clean")
            errors += bool(error)
            out_hosts.append({"host": target, "entry": entry, "state": state, "drifted": edited, "switched": switched,
                              "fitness_drift": [] if error else fitness,
                              "serving_here": serving_here, "superseded": superseded and not error,
                              "host_serving": None if error else serving,
                              "readiness": readiness, "ready": None if error else (readiness == "ready"),
                              # Whether the fleet's router routes to the host (None: no router, or not read).
                              "router": None if error else h.get("router"),
                              "error": error, "last_check": checked_at})
        if not hosts and r.get("error"):
            errors += 1
        stacks.append({"stack": r["stack"], "error": r.get("error") if not hosts else None, "hosts": out_hosts})
    return {"version": 1, "checked_at": checked_at, "checked_at_seconds": checked_at_seconds,
            "check_errors_total": errors_before + errors, "stacks": stacks}


def _entries(doc: Optional[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(s["stack"], h["host"]): h for s in (doc or {}).get("stacks", []) for h in s["hosts"]}


def _item_key(item: dict[str, Any]) -> tuple[Any, ...]:
    return item["resource"], tuple(item["keys"]), tuple(item["lines"])


def describe(item: dict[str, Any]) -> str:
    where = f"{item['resource']}" + (f" ({item['file']})" if item.get("file") else "")
    return f"{where}: " + ("; ".join(item["lines"]) if item["lines"] else ", ".join(item["keys"]) or item["op"])


def _serving_text(s: Optional[dict[str, Any]]) -> str:
    return f"{s['unit']} (stack {s['stack'] or 'unknown'})" if s else "nothing"


def _edited_line(item: dict[str, Any], host: str, stacks: list[str]) -> str:
    return f"edited: {_stacks_text(stacks)} on {host}: {describe(item)}"


def _clean_line(host: str, stacks: list[str]) -> str:
    return f"clean: {_stacks_text(stacks)} on {host}: no drift"


def _fitness_line(line: str, stacks: list[str]) -> str:
    return f"{line} ({_stacks_text(stacks)})"


def _fitness_clean_line(host: str, stacks: list[str]) -> str:
    return f"fitness: {host} is as its benchmark measured it again ({_stacks_text(stacks)})"


def _stacks_text(stacks: list[str]) -> str:
    return f"stack {stacks[0]}" if len(stacks) == 1 else "stacks " + ", ".join(stacks)


def changes(before: Optional[dict[str, Any]], now: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed since the previous tick, one entry per change: kind (switched, edited, clean,
    fitness, unreachable, reachable, readiness, router), stack (the first of `stacks`), stacks, host, line.
    The first tick (`before` None) only records: what it finds is the state the next tick compares
    with, not a change. One edit is one entry per host and file, however many stacks declare the
    file (the shared environment file belongs to every strategy stack of the model)."""
    if before is None:
        return []
    old, new = _entries(before), _entries(now)
    out: list[dict[str, Any]] = []
    seen_hosts: set[str] = set()
    # A change several stacks see (one edit of a shared file, one host clean again): one entry,
    # naming each stack, where the first stack met it.
    grouped: dict[tuple[Any, ...], dict[str, Any]] = {}

    def add(kind: str, stack: Optional[str], host: str, line: str) -> None:
        out.append({"kind": kind, "stack": stack, "stacks": [stack] if stack else [], "host": host, "line": line})

    def add_grouped(key: tuple[Any, ...], kind: str, stack: str, host: str, words: Callable[[list[str]], str]) -> None:
        entry = grouped.get(key)
        if entry is None:
            entry = grouped[key] = {"kind": kind, "stack": stack, "stacks": [], "host": host, "words": words}
            out.append(entry)
        if stack not in entry["stacks"]:
            entry["stacks"].append(stack)

    for (stack, host), h in new.items():
        p = old.get((stack, host))
        was_error = (p or {}).get("error")
        if h["error"]:
            if h["error"] != was_error:
                add("unreachable", stack, host, f"unreachable: stack {stack} on {host} not checked: {h['error']} "
                    "(the next tick retries)")
            continue
        if was_error:
            add("reachable", stack, host, f"reachable: stack {stack} on {host} checked again")
        if host not in seen_hosts and p is not None and not was_error and p.get("host_serving") != h["host_serving"]:
            seen_hosts.add(host)
            add("switched", None, host, f"switched: {host} serves {_serving_text(h['host_serving'])}, "
                f"was {_serving_text(p.get('host_serving'))}")
        if h["superseded"] and not (p or {}).get("superseded"):
            add("switched", stack, host, f"switched: stack {stack} on {host} is superseded, not edited: "
                f"{_serving_text(h['host_serving'])} serves in its place")
        elif p is not None and p.get("superseded") and not h["superseded"] and h["serving_here"]:
            add("switched", stack, host, f"switched: stack {stack} serves again on {host}")
        before_items = {_item_key(i) for i in (p or {}).get("drifted", [])}
        for item in h["drifted"]:
            if _item_key(item) not in before_items:
                where = item.get("file") or f"{stack}:{item['resource']}"
                add_grouped(("edited", host, where, tuple(item["lines"])), "edited", stack, host,
                            partial(_edited_line, item, host))
        if not h["drifted"] and before_items:
            add_grouped(("clean", host), "clean", stack, host,
                        partial(_clean_line, host))
        # The machine's own drift: one entry a host and line, however many stacks read it there.
        was_fitness = (p or {}).get("fitness_drift") or []
        for line in h.get("fitness_drift") or []:
            if line not in was_fitness:
                add_grouped(("fitness", host, line), "fitness", stack, host, partial(_fitness_line, line))
        if p is not None and was_fitness and not h.get("fitness_drift"):
            add_grouped(("fitness-clean", host), "fitness", stack, host, partial(_fitness_clean_line, host))
        if p is not None and not was_error and h["serving_here"] and p.get("serving_here") \
                and p.get("readiness") != h["readiness"]:
            add("readiness", stack, host, f"readiness: stack {stack} on {host}: {p.get('readiness') or 'unknown'} -> "
                f"{h['readiness'] or 'unknown'}")
        router, was = h.get("router"), (p or {}).get("router")
        if p is not None and not was_error and router and (was or {}).get("in_router") != router.get("in_router") \
                and ("router", host) not in grouped:
            grouped[("router", host)] = {}
            add("router", None, host, f"router: {host}: {router.get('text')}")
    for s in now.get("stacks", []):
        if s.get("error") and s["error"] != next((b.get("error") for b in (before or {}).get("stacks", [])
                                                  if b["stack"] == s["stack"]), None):
            add("unreachable", s["stack"], "", f"error: stack {s['stack']} not checked: {s['error']}")
    for entry in out:
        words = entry.pop("words", None)
        if words is not None:
            entry["line"] = words(entry["stacks"])
    return out


# --- the files ---------------------------------------------------------------------------------

def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


METRICS = (
    ("gpu_serving_drifted_resources", "gauge", "Resources of the stack whose host truth differs from the declaration "
     "(hand edits; a switch by another stack is not counted)"),
    ("gpu_serving_superseded", "gauge", "1 when another stack's unit serves on the host in this stack's place"),
    ("gpu_serving_serving", "gauge", "1 when this stack's unit serves on the host"),
    ("gpu_serving_ready", "gauge", "1 when this stack serves on the host and its readiness is ready"),
    ("gpu_serving_host_up", "gauge", "1 when the last check reached the host"),
    ("gpu_serving_in_router", "gauge", "1 when the fleet's router routes to the host (only hosts behind a router it read)"),
    ("gpu_serving_fitness_drift", "gauge", "1 when the host's GPUs differ from its benchmark baseline (power, clocks, "
     "PCIe link, ECC, driver: not repairable by pulumi up)"),
)


def render_prometheus(doc: dict[str, Any]) -> str:
    """The tick in Prometheus' text exposition format (node_exporter's textfile collector reads it)."""
    rows = [(s["stack"], h) for s in doc["stacks"] for h in s["hosts"]]
    values = {
        "gpu_serving_drifted_resources": lambda h: len(h["drifted"]),
        "gpu_serving_superseded": lambda h: int(bool(h["superseded"])),
        "gpu_serving_serving": lambda h: int(bool(h["serving_here"])),
        "gpu_serving_ready": lambda h: int(bool(h["ready"])),
        "gpu_serving_host_up": lambda h: int(not h["error"]),
        "gpu_serving_in_router": lambda h: int(bool((h.get("router") or {}).get("in_router"))),
        "gpu_serving_fitness_drift": lambda h: int(bool(h.get("fitness_drift"))),
    }
    out = []
    for name, kind, help_text in METRICS:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for stack, h in rows:
            if name == "gpu_serving_in_router" and (h.get("router") or {}).get("in_router") is None:
                continue
            out.append(f'{name}{{stack="{_label(stack)}",host="{_label(h["host"])}"}} {values[name](h)}')
    out += ["# HELP gpu_serving_last_check_timestamp_seconds When the last tick finished (Unix time)",
            "# TYPE gpu_serving_last_check_timestamp_seconds gauge",
            f"gpu_serving_last_check_timestamp_seconds {doc['checked_at_seconds']:.3f}",
            "# HELP gpu_serving_check_errors_total Checks of a stack on a host that failed (unreachable host, engine error)",
            "# TYPE gpu_serving_check_errors_total counter",
            f"gpu_serving_check_errors_total {doc['check_errors_total']}"]
    return "\n".join(out) + "\n"


def webhook_payload(doc: dict[str, Any], found: list[dict[str, Any]]) -> dict[str, Any]:
    """What the webhook receives on a change: the changes and the tick's summary per stack and host."""
    return {"checked_at": doc["checked_at"], "changes": found,
            "status": [{"stack": s["stack"], "host": h["host"], "state": h["state"], "drifted": len(h["drifted"]),
                        **({"fitness_drift": h["fitness_drift"]} if h.get("fitness_drift") else {})}
                       for s in doc["stacks"] for h in s["hosts"]]}


# --- the systemd pair ------------------------------------------------------------------------

def render_systemd(*, checkout: str, stacks: list[str], every_seconds: int, state_dir: str,
                   env_file: str, webhook: Optional[str] = None, apply: bool = False) -> dict[str, str]:
    """The service + timer an operator installs on their admin machine: the timer starts one
    `watch --once` tick every `every_seconds`; the service sources scripts/env.sh (the engine on
    PATH) after the operator's environment file (backend URL, passphrase: never in the unit).
    `apply`: the tick may perform a recommended switch (`watch --apply`): its `pulumi up` rolls
    the fleet for as long as the hosts' starts and readiness take, bounded by their own deadlines,
    so systemd does not cut the tick short (a roll killed half-way leaves a host out of the router)."""
    argv = f"python -m components watch --once --stacks {','.join(stacks)} --state-dir {state_dir}"
    if apply:
        argv += " --apply"
    if webhook:
        argv += f" --webhook {webhook}"
    what = ("may switch to the recommended stack: pulumi up, inside gpu-serving:autoswitch's windows" if apply
            else "never changes a host")
    timeout = "infinity" if apply else str(max(600, every_seconds))
    service = f"""[Unit]
Description=gpu-serving drift watch: one tick (pulumi preview --refresh of {', '.join(stacks)}; {what})
Documentation=file://{checkout}/docs/teams-and-watch.md
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
WorkingDirectory={checkout}
# PULUMI_BACKEND_URL, PULUMI_CONFIG_PASSPHRASE (or _FILE), PGPASSFILE, GPU_SERVING_WATCH_WEBHOOK:
# the operator's, not the repo's (a webhook URL may hold a token).
EnvironmentFile=-{env_file}
ExecStart=/bin/bash -c 'source scripts/env.sh && exec {argv}'
TimeoutStartSec={timeout}
"""
    timer = f"""[Unit]
Description=gpu-serving drift watch every {every_seconds} s

[Timer]
OnActiveSec=1min
OnUnitActiveSec={every_seconds}s

[Install]
WantedBy=timers.target
"""
    return {"gpu-serving-watch.service": service, "gpu-serving-watch.timer": timer}
