"""The benchmark runner: gpu-serving vs Ansible vs pyinfra vs a raw ssh script, on the same
rehearsal hosts, in the same run. See docs/benchmarks.md.

Scenarios (each repeated; every timed run is followed by a check that the host is in the
declared state, so a tool cannot win by doing less):

- noop: everything deployed (ep8 serving); the tool's normal apply;
- drift: the tool's drift check, nothing drifted;
- switch: tp8 serving -> the tool's apply of ep8, until /health_generate answers;
- fleet: noop and switch on 1, 2 and 4 hosts at once (one inventory; for gpu-serving one stack
  listing the hosts in gpu-serving:hosts, or with --gpu-serving-fleet stacks one stack per host
  run in parallel, as before fleets existed);
- router (gpu-serving only, on the largest fleet): "fleet switch with router", the rolling switch
  behind SGLang's router against the all-at-once switch, under 4 clients sending requests through
  the router (bench/router.py). `--scenarios router` runs it alone (no peers, no warm-ups).

SSH connections and sessions are counted from each host's sshd log.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import acct, cpusplit, downtime
from . import hosts as H
from . import stats
from . import tools, trace
from .router import RouterScenario
from .tools import (Ansible, EmptyPulumi, GpuServing, GpuServingCold, GpuServingNoCheckpoints, Pyinfra, RawSsh, Tool,
                    ToolFailed)
from .workspace import BENCH, PROGRAM, REPO, cache_root, ensure_bench_venv, log, make_empty_project, make_project

RESULTS = BENCH / "results"
STACKS = ("tp8", "ep8", "pp8")
FROM, TO = "tp8", "ep8"
# How often a run lost to the rehearsal hosts' cgroup race (hosts.CGROUP_FLAKES: the container's
# doing, not the tool's) is tried: on a busy day one 4-host switch in four hits it.
CGROUP_TRIES = 5


def plans_of(project) -> dict[str, dict]:
    """Each strategy's plan (`python -m components plan --json`), with its port and `siblings`:
    the units of the other strategies the benchmark deploys (tp8, ep8), which the serving one's
    deploy disables, as gpu-serving does (only the serving strategy is enabled)."""
    plans = {}
    for stack in STACKS:
        p = project.plan(stack)
        argv = p["exec_start"]
        p["port"] = int(argv[argv.index("--port") + 1])
        plans[stack] = p
    for stack, p in plans.items():
        p["siblings"] = [plans[s]["unit_name"] for s in (FROM, TO) if s != stack and plans[s]["unit_name"] in p["conflicts"]]
    return plans


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work)
        self.samples: dict = {"single": {}, "fleet": {}}
        self.variants: dict = {}
        self.split: dict = {}
        self.split_switch: dict = {}
        self.flakes: list[str] = []
        self.first_deploy = None
        # Only the router scenario: none of the per-tool setup (peers, first deploys, warm-ups).
        self.router_only = set(args.scenarios) == {stats.ROUTER}
        self.projects: dict = {}

    # ----------------------------------------------------------------------------------------
    def setup(self) -> None:
        n = max(self.args.fleet)
        if not self.args.reuse_hosts:
            shutil.rmtree(self.work, ignore_errors=True)  # fresh hosts, fresh stacks
        if self.router_only:
            self.hosts = H.boot([f"{self.args.host_prefix}{i}" for i in range(n)], log, fresh=not self.args.reuse_hosts)
            self.tools, self.gs_skip = [], None
            return
        venv = ensure_bench_venv()
        self.hosts = H.boot([f"{self.args.host_prefix}{i}" for i in range(n)], log, fresh=not self.args.reuse_hosts)
        load = self.args.load_seconds
        self.projects = {h.name: make_project(self.work, h.name, self.args.program_ref,
                                              tuple(self.args.program_paths or PROGRAM), load_seconds=load) for h in self.hosts}
        tools.use_peers(self.work / "peers")
        self.plans = plans_of(self.projects[self.hosts[0].name])
        for h in self.hosts[1:]:
            other = plans_of(self.projects[h.name])
            if any(other[s][k] != self.plans[s][k] for s in STACKS for k in ("unit_text", "environment_text", "unit_name")):
                raise SystemExit("the rendered units differ between hosts: the runner expects the same plan everywhere")
        # A fleet project per fleet size: one stack listing bench0..bench<n-1>.
        self.fleets = {} if self.args.gpu_serving_fleet == "stacks" else {
            tuple(h.name for h in self.hosts[:n]): make_project(
                self.work, "", self.args.program_ref, tuple(self.args.program_paths or PROGRAM),
                fleet=[h.name for h in self.hosts[:n]], load_seconds=load)
            for n in self.args.fleet if n > 1}
        self.empty = make_empty_project(self.work) if "empty-pulumi" in self.args.tools else None
        all_tools: list[Tool] = [GpuServing(self.projects, fleets=self.fleets),
                                 GpuServingCold(self.projects, fleets=self.fleets),
                                 GpuServingNoCheckpoints(self.projects, fleets=self.fleets),
                                 *([EmptyPulumi(self.empty)] if self.empty else []), Ansible(venv, self.work, self.plans),
                                 Pyinfra(venv, self.work, self.plans), RawSsh(self.work, self.plans)]
        self.tools = [t for t in all_tools if t.name in self.args.tools]
        self.gs_skip = GpuServing(self.projects, ("--skip-preview",), self.fleets) if "gpu-serving" in self.args.tools else None
        # gpu-serving first: it installs CUDA and the venv, then every strategy unit.
        log("first deploy with gpu-serving on every host (CUDA, venv, tp8 then ep8 units)")
        gs = GpuServing(self.projects)
        t0 = time.monotonic()
        for stack in (FROM, TO):
            self.reset_limits(self.hosts)
            gs.converge(stack, self.hosts)
            if stack == FROM:
                self.first_deploy = round(time.monotonic() - t0, 1)
                log(f"first deploy of {FROM} on {len(self.hosts)} fresh host(s) in parallel: {self.first_deploy} s")
        # The fleet stacks take over what is there (CUDA, venv and units read as present).
        for key, project in self.fleets.items():
            hosts = [h for h in self.hosts if h.name in key]
            for stack in (FROM, TO):
                self.reset_limits(hosts)
                GpuServing(self.projects, fleets={key: project}).converge(stack, hosts)
            log(f"fleet stack for {', '.join(key)} deployed")
        self.verify(TO, self.hosts, "gpu-serving setup")
        # Every tool converges once untimed (warm caches, and proof it leaves the same state).
        for tool in self.tools:
            if "switch" not in tool.scenarios:
                continue
            for stack in (FROM, TO):
                self.reset_limits(self.hosts)
                tool.converge(stack, self.hosts)
                tool.after_run()
                self.verify(stack, self.hosts, f"{tool.name} warm-up {stack}")
        log("every tool leaves every host in the same state")

    def verify(self, stack: str, hosts: list[H.Host], what: str) -> None:
        states = H.parallel(hosts, lambda h: H.host_state(h, self.plans))
        problems = [f"{h.name}: {p}" for h, st in zip(hosts, states) for p in H.expected_problems(st, self.plans, stack)]
        if problems:
            raise SystemExit(f"after {what} the host is not in the declared state:\n  " + "\n  ".join(problems))

    # ----------------------------------------------------------------------------------------
    def measure(self, tool: Tool, what: str, stack: str, hosts: list[H.Host], scenario: str) -> dict:
        """One timed run; a run lost to the rehearsal hosts' cgroup race (not the tool's doing)
        is set up again and repeated (CGROUP_TRIES in all), and counted in the results."""
        for attempt in range(CGROUP_TRIES):
            if scenario == "switch":
                self.reset(hosts)
            counter = H.Counter(hosts)
            counter.start()
            wall = time.time()
            # gpu-serving's switches: the downtime, from the host side (bench/downtime.py).
            probers = [downtime.Prober(h.info.address, self.plans[stack]["port"]) for h in hosts] \
                if scenario == "switch" and tool.name == "gpu-serving" else []
            for p in probers:
                p.__enter__()
            # Accounting is the whole machine's: never left on past the run, whatever ends it.
            with acct.Accounting() if self.args.account else contextlib.nullcontext() as accounting, \
                    cpusplit.Recorder() if self.args.cpu_split else contextlib.nullcontext() as sampled:
                t0, cpu0 = time.monotonic(), machine_cpu()
                failed = None
                try:
                    result = getattr(tool, what)(stack, hosts)
                except ToolFailed as exc:
                    failed = exc
                seconds, cpu = time.monotonic() - t0, machine_cpu() - cpu0
                # when the tool returned: not after perf has stopped and written its samples out
                returned = time.time()
            for p in probers:
                p.__exit__()
            tool.after_run()
            conns, sessions = counter.stop()
            if self._lost_to_cgroup_race(hosts, wall, attempt):
                # A unit failed to start, or to stop, for the container's reasons; the tool then
                # failed or waited for systemd: either way the run measured the host, not the tool.
                self.flakes.append(f"{scenario} N={len(hosts)} {tool.name}")
                log(f"{tool.name}: a unit lost the rehearsal host's cgroup race; running it again")
                self.reset(hosts)
                if scenario != "switch":
                    H.parallel(hosts, lambda h: H.serve(h, self.plans[stack]["unit_name"], self.plans[stack]["port"],
                                                        self.unit_names))
                continue
            if failed:
                raise failed
            break
        sample = {"seconds": round(seconds, 4), "connections": conns, "sessions": sessions, "cpu": round(cpu, 2)}
        if sampled:
            sample["cpu_split"] = sampled.split(t0, t0 + seconds)
        if accounting:
            sample["accounted"] = {c: {"count": v["count"], "cpu": round(v["cpu"], 3)} for c, v in accounting.table.items()}
        if probers:
            units = [self.plans[FROM]["unit_name"], self.plans[TO]["unit_name"]]
            per_host = [downtime.compute(p.results, downtime.journal_events(h.journal, wall - 1, units), *units)
                        for h, p in zip(hosts, probers)]
            sample["downtime"] = downtime.combine(per_host, returned)
        if what == "check":
            sample["drift"] = bool(result)
            if result:
                raise ToolFailed(f"{tool.name} reported drift on an undrifted host")
        else:
            self.verify(stack, hosts, f"{tool.name} {what} {stack}")
        return sample

    @property
    def unit_names(self) -> list[str]:
        """The unit of every strategy the benchmark deploys."""
        return [p["unit_name"] for p in self.plans.values()]

    def _lost_to_cgroup_race(self, hosts: list[H.Host], since: float, attempt: int) -> bool:
        """Was attempt `attempt` (from 0) lost to the rehearsal hosts' cgroup race since `since`
        (hosts.CGROUP_FLAKES), with an attempt of CGROUP_TRIES left to run it again?"""
        if attempt >= CGROUP_TRIES - 1:
            return False
        return any(H.parallel(hosts, lambda h: H.cgroup_flake(h, self.unit_names, since)))

    def reset_limits(self, hosts: list[H.Host]) -> None:
        units = " ".join(self.unit_names)
        H.parallel(hosts, lambda h: h.sh(f"systemctl reset-failed {units} 2>/dev/null; true"))

    def reset(self, hosts: list[H.Host]) -> None:
        """tp8 serving, every host: the same starting point for every tool's switch."""
        H.parallel(hosts, lambda h: H.serve(h, self.plans[FROM]["unit_name"], self.plans[FROM]["port"], self.unit_names))

    def run_scenario(self, scenario: str, hosts: list[H.Host], tools: list[Tool]) -> dict[str, list[dict]]:
        tools = [t for t in tools if scenario in t.scenarios and (len(hosts) == 1 or t.name != "empty-pulumi")]
        out: dict[str, list[dict]] = {t.name: [] for t in tools}
        n = len(hosts)
        for rep in range(self.args.repeat):
            order = tools[rep % len(tools):] + tools[:rep % len(tools)]  # rotate: no tool always runs first
            for tool in order:
                what = "check" if scenario == "drift" else "converge"
                sample = self.measure(tool, what, TO, hosts, scenario)
                out[tool.name].append(sample)
                log(f"{scenario:6} N={n} {tool.name:12} run {rep + 1}/{self.args.repeat}: {sample['seconds']:.2f} s, "
                    f"{sample['connections']} ssh connection(s), {sample['sessions']} session(s)"
                    + (f"; downtime {sample['downtime']}" if sample.get("downtime") else ""))
        return out

    def run(self) -> None:
        one = self.hosts[:1]
        for scenario in self.args.scenarios:
            if scenario != stats.ROUTER:
                self.samples["single"][scenario] = self.run_scenario(scenario, one, self.tools)
        if self.gs_skip and not self.args.no_variants:
            for scenario in ("noop", "switch"):
                if scenario in self.args.scenarios:
                    v = self.run_scenario(scenario, one, [self.gs_skip])
                    self.variants[f"{scenario}: pulumi up --yes --skip-preview"] = v[self.gs_skip.name]
        if self.args.split:
            self.run_split(one)
        for scenario in stats.FLEET_SCENARIOS:
            if scenario not in self.args.scenarios:
                continue
            by_n = {1: {t: v for t, v in self.samples["single"][scenario].items() if t != "empty-pulumi"}}
            for n in self.args.fleet:
                if n > 1:
                    by_n[n] = self.run_scenario(scenario, self.hosts[:n], self.tools)
            self.samples["fleet"][scenario] = by_n
        if self.args.split and "switch" in self.args.scenarios:
            self.run_split_switch()
        if stats.ROUTER in self.args.scenarios:
            self.router = RouterScenario(self.work, self.hosts[:max(self.args.fleet)], self.args.repeat, log)
            self.router.setup()
            self.samples[stats.ROUTER] = self.router.run()

    def env(self) -> dict:
        """The engine's environment of a project of this run (for the versions it reports)."""
        if self.projects:
            return next(iter(self.projects.values())).env
        return self.router.env

    def run_split(self, hosts: list[H.Host]) -> None:
        """Traced runs (`-v=9`: not timed runs, the log costs time) of gpu-serving's no-op and
        drift check and of the empty program's, alternating, split into phases by bench/trace.py."""
        # gpu-serving (and gpu-serving-cold, when measured: the same projects, warm start off).
        runs = [(t.name, t.project if t.name == "empty-pulumi" else t.projects[hosts[0].name], t)
                for t in self.tools if t.name in ("gpu-serving", "gpu-serving-cold", "empty-pulumi")]
        for scenario in ("noop", "drift"):
            if scenario not in self.args.scenarios:
                continue
            what = "converge" if scenario == "noop" else "check"
            self.split[scenario] = {name: [] for name, _, _ in runs}
            for rep in range(self.args.split):
                for name, project, tool in runs:
                    args = tool.args(what) if name == "empty-pulumi" else tool.args(what, TO)
                    started, ended, text = tools.traced(project, args)
                    s = trace.split(text.splitlines(), started, ended)
                    self.split[scenario][name].append(s)
                    log(f"split  {scenario:6} {name:12} run {rep + 1}/{self.args.split}: " +
                        ", ".join(f"{k} {v:.2f}" for k, v in s.items() if isinstance(v, float)))
            self.verify(TO, hosts, "the traced runs")

    def run_split_switch(self) -> None:
        """Traced switches (`-v=9`, not timed runs) of gpu-serving, on each fleet size: where a
        switch's time goes as the hosts grow (bench/trace.py: switch_phases). Each from tp8
        serving on every host, as a timed switch."""
        gs = next((t for t in self.tools if t.name == "gpu-serving"), None)
        if gs is None:
            return
        for n in self.args.fleet:
            group = self.hosts[:n]
            # One engine run for the fleet: a fleet project (none with --gpu-serving-fleet stacks).
            project = gs.projects[group[0].name] if n == 1 else gs.fleets.get(tuple(h.name for h in group))
            if project is None:
                continue
            self.split_switch[n] = []
            for rep in range(self.args.split):
                self.split_switch[n].append(self._traced_switch(gs, project, group))
                s = self.split_switch[n][-1]
                log(f"split  switch N={n} run {rep + 1}/{self.args.split}: " +
                    ", ".join(f"{k} {s[k]:.2f}" for k in ("total", *trace.SWITCH_PHASES, "cli")))
            self.verify(TO, group, "the traced switches")

    def _traced_switch(self, gs: GpuServing, project, group: list[H.Host]) -> dict:
        for attempt in range(CGROUP_TRIES):
            self.reset(group)
            wall = time.time()
            try:
                started, ended, text = tools.traced(project, gs.args("converge", TO))
            except ToolFailed:
                # As a timed run: a unit lost to the rehearsal hosts' cgroup race is run again.
                if self._lost_to_cgroup_race(group, wall, attempt):
                    self.flakes.append(f"traced switch N={len(group)}")
                    continue
                raise
            return trace.switch_phases(text.splitlines(), started, ended)
        raise AssertionError("unreachable")

    def teardown(self) -> None:
        if self.args.keep_hosts:
            log(f"hosts left running: {', '.join(h.name for h in self.hosts)} (python -m rehearsal down NAME)")
            return
        from rehearsal import host as rh
        for h in getattr(self, "hosts", []):
            rh.down(h.name)
        shutil.rmtree(self.work, ignore_errors=True)


# --------------------------------------------------------------------------------------------
def machine_cpu() -> float:
    """CPU seconds this machine has spent working since boot (/proc/stat: user, nice, system, irq,
    softirq; not idle, iowait or steal). Over a run: the tool's work and its rehearsal hosts'
    (they share this machine's cores), which bounds how fast N hosts can go here at all."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine_info(env: dict) -> dict:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    venv = cache_root() / "bench-venv" / "bin"
    commit = _version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "components", "Pulumi.yaml", "bench"],
                                stdout=subprocess.PIPE, text=True).stdout.strip())
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory": mem, "kernel": platform.release(),
        "python": platform.python_version(), "pulumi": _version(["env", f"PATH={env['PATH']}", "pulumi", "version"]),
        "ansible-core": _version([str(venv / "ansible-playbook"), "--version"]),
        "pyinfra": _version([str(venv / "pyinfra"), "--version"]),
        "openssh": _version(["ssh", "-V"]),
        "commit": commit + ("+dirty" if dirty else ""),
    }


def _host_prefix(text: str) -> str:
    # A rehearsal host name is [a-z][a-z0-9-]{0,10}; a digit goes after the prefix.
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,9}", text):
        raise argparse.ArgumentTypeError(f"--host-prefix {text!r}: 1-10 characters of a-z, 0-9, '-', starting with a letter (e.g. bench)")
    return text


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 runs each, fleet of 1 and 2 hosts (a few minutes)")
    p.add_argument("--repeat", type=int, help="timed runs per tool and scenario (default 4, --quick 2)")
    p.add_argument("--fleet", type=lambda s: sorted({int(x) for x in s.split(",")} | {1}),
                   help="host counts for fleet scaling (default 1,2,4; --quick 1,2)")
    p.add_argument("--tools", type=lambda s: s.split(","), default=list(stats.TOOLS),
                   help=f"comma-separated subset of {','.join(stats.TOOLS)}, and {','.join(stats.OPTIONAL_TOOLS)} "
                        "(warm start off; the state written once at the end, a measurement of its writes)")
    p.add_argument("--scenarios", type=lambda s: s.split(","), default=list(stats.SCENARIOS),
                   help=f"comma-separated subset of {','.join(stats.SCENARIOS)}")
    p.add_argument("--no-variants", action="store_true", help="skip the gpu-serving --skip-preview rows")
    p.add_argument("--split", type=int, default=None,
                   help="traced runs (-v=9) of gpu-serving's and the empty program's no-op and drift check, and of "
                        "gpu-serving's switch on each fleet size, split into phases (default 3, --quick 2; 0: none)")
    p.add_argument("--reuse-hosts", action="store_true", help="keep what bench0.. have (default: fresh hosts)")
    p.add_argument("--keep-hosts", action="store_true", help="leave the rehearsal hosts (bench0..) running")
    p.add_argument("--host-prefix", default="bench", type=_host_prefix,
                   help="rehearsal host names PREFIX0.. (default bench: bench0..); another prefix lets two runs share the machine")
    p.add_argument("--work", help="scratch directory, removed at the end (default: bench-work, or bench-work-PREFIX, in the cache)")
    p.add_argument("--out", default=str(RESULTS), help="where the results JSON goes (default bench/results)")
    p.add_argument("--program-ref", help="benchmark the program (components/, Pulumi*.yaml) as of this git commit")
    p.add_argument("--program-paths", type=lambda s: s.split(","),
                   help="with --program-ref: only these paths from the commit (default: components/, __main__.py, Pulumi*.yaml)")
    p.add_argument("--gpu-serving-fleet", choices=("hosts", "stacks"),
                   help="a gpu-serving fleet as one stack with gpu-serving:hosts (default) or one stack per host "
                        "in parallel (default with --program-ref: a program from before fleets)")
    p.add_argument("--load-seconds", type=float, default=0,
                   help="the rehearsal engine loads for this long (REHEARSAL_LOAD_SECONDS; default 0: the tool is timed); "
                        "the downtime rows (a), (b), (c) are measured on every gpu-serving switch")
    p.add_argument("--account", action="store_true",
                   help="process accounting during each timed run: CPU s by command in each sample ('accounted', bench/acct.py)")
    p.add_argument("--cpu-split", action="store_true",
                   help="perf record of the whole machine during each timed run: the CPU s of the rehearsal hosts and of "
                        "this machine (the tool), by command, in each sample ('cpu_split', bench/cpusplit.py)")
    p.add_argument("--note", default="", help="a note stored with the results (e.g. 'before optimisations')")
    args = p.parse_args(argv)
    if args.work is None:
        args.work = str(cache_root() / ("bench-work" if args.host_prefix == "bench" else f"bench-work-{args.host_prefix}"))
    if args.repeat is None:
        args.repeat = 2 if args.quick else 4
    if args.split is None:
        args.split = 2 if args.quick else 3
    if args.fleet is None:
        args.fleet = [1, 2] if args.quick else [1, 2, 4]
    if args.gpu_serving_fleet is None:
        args.gpu_serving_fleet = "stacks" if args.program_ref else "hosts"
    unknown = set(args.tools) - set(stats.TOOLS) - set(stats.OPTIONAL_TOOLS) | set(args.scenarios) - set(stats.SCENARIOS)
    if unknown:
        p.error(f"unknown tool or scenario: {', '.join(sorted(unknown))}")
    if max(args.fleet) > 8:
        p.error("at most 8 hosts")
    if stats.ROUTER in args.scenarios and max(args.fleet) < 2:
        p.error("the router scenario switches a fleet: --fleet with at least 2 hosts (e.g. --fleet 1,3)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # As on a user's machine: Python caches bytecode (this workplace's shell turns that off).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if os.geteuid() != 0:
        print("bench/run needs root (rehearsal hosts: systemd-nspawn, mounts, network namespaces)", file=sys.stderr)
        return 2
    if args.cpu_split and shutil.which("perf") is None:
        print("bench/run --cpu-split needs perf (Debian: apt-get install linux-perf; scripts/install-host-deps "
              "installs it)", file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    bench = Bench(args)
    try:
        bench.setup()
        bench.run()
    except ToolFailed as exc:
        print(f"bench: a tool failed, no results written:\n{exc}", file=sys.stderr)
        return 1
    finally:
        if "bench" in locals():
            try:
                bench.teardown()
            except Exception as exc:  # never hide the real error
                print(f"bench: teardown: {exc}", file=sys.stderr)
    env = bench.env()
    results = {
        "started": started,
        "seconds": round(time.monotonic() - t0, 1),
        "machine": machine_info(env),
        "config": {"program_ref": args.program_ref, "program_paths": args.program_paths,
                   "gpu_serving_fleet": args.gpu_serving_fleet, "repeat": args.repeat, "fleet": args.fleet,
                   "tools": args.tools, "scenarios": args.scenarios,
                   "quick": args.quick, "note": args.note, "load_seconds": args.load_seconds,
                   "account": args.account, "cpu_split": args.cpu_split},
        "samples": bench.samples,
        "variants": bench.variants,
        "split": bench.split,
        "split_switch": {str(n): v for n, v in bench.split_switch.items()},
        "flakes": bench.flakes,
        "first_deploy_seconds": bench.first_deploy,
    }
    results["summary"] = stats.summarize_results(bench.samples)
    results["summary"]["variants"] = {k: stats.summarize_samples(v) for k, v in bench.variants.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (started.replace(":", "").replace("-", "") + ".json")
    path.write_text(json.dumps(results, indent=1) + "\n")
    print()
    print(render(results))
    print(f"\nresults: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


def render(results: dict) -> str:
    m = results["machine"]
    c = results["config"]
    head = (f"gpu-serving benchmarks, {results['started']} ({results['seconds']:.0f} s), {c['repeat']} runs each"
            f"{', quick' if c.get('quick') else ''}{' — ' + c['note'] if c.get('note') else ''}\n"
            f"machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['pulumi']}; {m['ansible-core']}; "
            f"{m['pyinfra']}; {m['openssh']}; commit {m['commit']}\n")
    body = stats.report(results)
    variants = results.get("summary", {}).get("variants") or {}
    if variants:
        rows = [[k, stats._f(v["seconds"]["median"]), stats._num(v.get("connections")), stats._num(v.get("sessions"))]
                for k, v in variants.items() if v]
        body += "\n### gpu-serving variants (1 host)\n\n" + stats.table(["variant", "median s", "ssh conns", "ssh sessions"], rows) + "\n"
    return head + "\n" + body
