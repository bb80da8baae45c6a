"""``python -m components plan --stack NAME [--json] [--against STACK]``: the program's own check
(core/plan.py `check_stack`) on the stack's files, and the serving plan it renders, before any SSH;
with --against, what switching from STACK changes. Exit 0 planned; 2 on a bad setting."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..core import pd_switch
from ..core.errors import ConfigError
from ..core.layout_words import layout_text
from ..core.plan import PD_NOT_DEPLOYED, CheckedStack, ServingPlan, check_stack
from ..core.stack_config import from_files
from ..remote import ledger_store, rehearsal_adapter


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="validate a strategy stack and print its serving plan")
    p.add_argument("--stack", required=True, help="strategy stack (reads Pulumi.yaml + Pulumi.<stack>.yaml)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--project-dir", default=".", type=Path, help="directory holding Pulumi.yaml (default: .)")
    p.add_argument("--against", metavar="STACK",
                   help="show what switching from STACK to --stack changes: a line diff of units and environment")


def _print_plan(plan: ServingPlan) -> None:
    d = plan.as_dict()
    L, m = d["layout"], plan.memory
    print(f"stack {d['stack']}: strategy {d['strategy']} for {d['model']['name']} on {d['host']['address']}")
    print(f"  layout       {layout_text(L, detail=True)} = world size {d['world_size']} of {d['host']['gpu_count']} GPUs")
    print(f"  memory/GPU   {m.gpu_memory_gb:g} GB x {m.mem_fraction_static:g} = {m.static_budget_gb} GB for weights + KV pool")
    for s in m.stages:
        print(f"    stage {s.stage}: {s.layers} layers, weights {s.weights_gb} GB, KV pool {s.kv_pool_gb} GB,"
              f" {s.kv_bytes_per_token:,} B/token, {s.max_total_tokens:,} tokens")
    print(f"  KV capacity  {m.max_total_tokens:,} tokens per replica; "
          f"demand {m.max_running_requests} x {m.context_length} = {m.token_demand:,}")
    for w in plan.warnings:
        print(f"  warning      {w}")
    node = plan.settings.node
    if node:
        print(f"  node         rank {node.rank} of {node.nnodes} ({', '.join(node.names)}); the ranks meet at rank 0,"
              f" {node.dist_init_addr}{_rank0_note(node)}")
    print(f"  unit         {d['unit_name']}" + (f" (Conflicts= {' '.join(d['conflicts'])})" if d["conflicts"] else ""))
    print(f"  environment  {d['environment_path']}")
    print("\n--- " + d["unit_name"])
    print(d["unit_text"], end="")
    print("--- " + d["environment_path"])
    print(d["environment_text"], end="")


def _rank0_note(node) -> str:
    """Where a rehearsal rank 0's address came from: the running host, or a stand-in."""
    if node.rank0_address.startswith("rehearsal-"):
        return (f"\n               ({node.rank0_address} stands in: the rehearsal host is not running; the unit files get its"
                f" address when scripts/deploy has booted it)")
    return ""


def _print_checked(checked: CheckedStack) -> None:
    """What the stack adds beyond one host's plan: its secrets (named, never shown) and the
    warnings about the stack as a whole."""
    env_path = checked.plans[0][1].unit.environment_path
    for name in checked.secrets:
        use = f"HF_TOKEN in {env_path}" if name == "hfToken" else "the SSH login"
        print(f"secret         gpu-serving:{name} (secret, not shown): {use}")
    plan_warnings = {w for _, p in checked.plans for w in p.warnings}
    for w in checked.warnings:
        if w not in plan_warnings:
            print(f"warning        {w}")


def _print_hosts(plans: list[tuple[str, ServingPlan]]) -> None:
    """A fleet: the plan once per distinct hardware (most fleets are one kind of machine)."""
    groups: dict[tuple, list[str]] = {}
    first: dict[tuple, ServingPlan] = {}
    for name, plan in plans:
        key = (plan.unit.text, plan.environment_text, repr(plan.memory.as_dict()))
        groups.setdefault(key, []).append(f"{name} ({plan.settings.host.target})")
        first.setdefault(key, plan)
    print(f"stack {plans[0][1].settings.stack}: {len(plans)} hosts")
    for key, names in groups.items():
        role = first[key].settings.role
        print(f"\n=== {role.role + ': ' if role else ''}{', '.join(names)}")
        _print_plan(first[key])


def _print_pd(pd) -> None:
    """What a prefill/decode stack adds: the KV path, what bounds concurrency, the router in PD mode."""
    print("\nprefill/decode disaggregation: " + ", ".join(f"{s.role} {s.host} ({s.url})" for s in pd.servers))
    for line in pd.lines:
        print(f"  {line}")
    print(f"  deploy       {PD_NOT_DEPLOYED}")
    print("\n--- the router's unit (PD mode)")
    print(pd.router_unit, end="")


def _switch(before: ServingPlan, after: ServingPlan) -> dict:
    """The switch from `before` to `after`: which unit stops, which starts, every changed line."""
    import difflib
    diffs = {}
    for name, a, b in (("unit", before.unit.text, after.unit.text),
                       ("environment", before.environment_text, after.environment_text)):
        diffs[name] = list(difflib.unified_diff(a.splitlines(), b.splitlines(), f"{before.settings.stack} {name}",
                                                f"{after.settings.stack} {name}", lineterm="", n=1))
    return {"from": before.settings.stack, "to": after.settings.stack, "stops": before.unit.name, "starts": after.unit.name,
            "layout": {"from": before.layout.describe(), "to": after.layout.describe()},
            "kv_tokens_per_replica": {"from": before.memory.max_total_tokens, "to": after.memory.max_total_tokens},
            "unit_diff": diffs["unit"], "environment_diff": diffs["environment"]}


def _print_switch(before: ServingPlan, after: ServingPlan) -> None:
    """The switch as a reviewer wants it: which unit stops, which starts, and every changed line."""
    d = _switch(before, after)
    print(f"switch {d['from']} -> {d['to']}: {d['stops']} stops, {d['starts']} starts")
    print(f"  layout  {d['layout']['from']}  ->  {d['layout']['to']}")
    print(f"  KV pool {d['kv_tokens_per_replica']['from']:,} -> {d['kv_tokens_per_replica']['to']:,} tokens per replica")
    for name in ("unit", "environment"):
        diff = d[f"{name}_diff"]
        print("\n".join(diff) if diff else f"  {name}: identical")


def run(args) -> int:
    try:
        # The program's own check (plan.check_stack), on the files instead of the engine's config.
        # A multi-node layout names rank 0's address: a running rehearsal host's is read from
        # its record on this machine (no connection), as the program does.
        found = rehearsal_adapter.addresses()
        checked = check_stack(args.stack, from_files(args.project_dir, args.stack), args.project_dir, found)
        plans = checked.plans
        plan = plans[0][1]
        before_checked = (check_stack(args.against, from_files(args.project_dir, args.against), args.project_dir,
                                      found) if args.against else None)
        before = before_checked.plans[0][1] if before_checked else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if before_checked is not None and before is not None and (checked.pd is not None or before_checked.pd is not None):
        switch = pd_switch.plan(pd_switch.side(before_checked, found), pd_switch.side(checked, found))
        if args.json:
            json.dump(switch.as_dict(), sys.stdout, indent=2)
            print()
        else:
            print(pd_switch.render(switch))
        return 0
    if before is not None:
        if args.json:
            json.dump(_switch(before, plan), sys.stdout, indent=2)
            print()
        else:
            _print_switch(before, plan)
        return 0
    ledger = ledger_store.warnings_before_stack(checked)
    if args.json:
        out = plan.as_dict()
        out["secrets"] = {f"gpu-serving:{name}": "(secret, not shown)" for name in checked.secrets}
        out["warnings"] = list(dict.fromkeys(out["warnings"] + checked.warnings + ledger))
        if plans[0][0]:
            out["hosts"] = [{"name": n, **p.as_dict()["host"], "memory": p.memory.as_dict()} for n, p in plans]
        if checked.pd is not None:
            out["disaggregation"] = checked.pd.as_dict()
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    if plans[0][0]:
        _print_hosts(plans)
    else:
        _print_plan(plan)
    if checked.pd is not None:
        _print_pd(checked.pd)
    _print_checked(checked)
    for w in ledger:
        print(f"warning        {w}")
    return 0
