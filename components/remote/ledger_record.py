"""A failed start written into the failure ledger: the switch executor's `fail()` hands it here
once the rollback is judged (core/ledger.py builds the signature, remote/ledger_store.py keeps it
beside the state, where the whole team's `plan`, `preview` and `advise` read it).

What a signature needs and the switch does not hold: the GPU model, driver and SGLang version
(one read of the failed node, after the failure: never on the way to a start), and the stack's
last good start, which only the service's stored state knows (`remember_last_good`, from the
provider's update, before the switch). Recording never changes the failure: a ledger that cannot
be reached is one more line of the message.
"""
from __future__ import annotations

from typing import Any

from ..core import ledger
from ..core import readiness as R
from ..core.specs import ServiceSpec, argv
from . import ssh
from .common import host_name
from .ledger_store import backend_url, store_for



# (stack, unit, hosts entry) -> the ExecStart of the stack's last start that was ready, as the
# service's state held it when this run's update began.
_LAST_GOOD: dict[tuple[str, str, str], list[str]] = {}


def _key(spec: ServiceSpec) -> tuple[str, str, str]:
    return spec.stack, spec.unit, spec.host_entry


def remember_last_good(olds: dict[str, Any]) -> None:
    """The service's update, before its switch: the state's ExecStart when its last start was ready
    (a failed switch leaves the state as it was, so this is the last start that worked)."""
    report = olds.get("readinessReport") or {}
    if isinstance(report, dict) and report.get("status") == R.READY and olds.get("execStart"):
        _LAST_GOOD[_key(ServiceSpec.from_props(olds))] = argv(olds["execStart"])


def _host_side(t: ssh.Target, start: list[str]) -> tuple[dict[str, Any], str]:
    out = ssh.run(t, ["sh", "-c", ledger.FAILED_START_SCRIPT, "sh", ledger.venv_of(start)],
                  purpose="reading the GPUs and SGLang for the failure ledger", timeout=60, check=False, read=True)
    return ledger.parse_failed_start(out.stdout)


def record(spec: ServiceSpec, node: Any, status: str, journal: str, served_again: bool) -> str:
    """Record the failed start of `spec` (`node`: the switch_executor.Node that explains it, with
    t, spec and props; `journal` its tail, already free of secrets); returns the line the failure's
    message ends with: the entry, or why it was not recorded."""
    start = node.spec.argv
    try:
        try:
            facts, sglang = _host_side(node.t, start)
        except ssh.RemoteError:
            facts, sglang = {}, ""  # the signature without them: a host that failed may not answer
        failure = ledger.signature(stack=spec.stack or spec.unit, host=host_name(node.props, node.t),
                                   outcome=status if served_again else ledger.ROLLBACK_FAILED, argv=start, journal=journal,
                                   model=ledger.model_of(start), last_good_argv=_LAST_GOOD.get(_key(spec)),
                                   facts=facts, sglang_version=sglang)
        store = store_for(backend_url())
        stored = store.add(failure)
    except Exception as exc:  # noqa: BLE001 - the ledger never changes what the failure says
        return f"\nThe failure ledger could not record this start: {ssh.redact(str(exc), spec.secrets)[:300]}"
    changed = f"; changed since the last good start: {'; '.join(stored.flags_changed)}" if stored.flags_changed else ""
    return (f"\nRecorded in the failure ledger as entry {stored.id} ({stored.error}{changed}): `plan` and `preview` "
            f"of these flags warn before the next start (`python -m components ledger` lists it; "
            f"`ledger clear --id {stored.id}` once it is fixed).")
