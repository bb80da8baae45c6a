"""SGLang's serving benchmark, run on the host over SSH against the stack's serving server, after
the same readiness read `status` makes (a server that is not `ready` in the declared layout is
never benchmarked). The pure parts and the result layout are in components/core/bench.py; the
command, ``python -m components bench --stack NAME``, is components/cli/serving_bench.py.

`BenchmarkProvider` runs the same benchmark inside `pulumi up` (`benchmark.onDeploy: true`),
after the readiness resource, and keeps its summary as the stack output `benchmark`.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from ..core import bench as B
from ..core.cache import cache_root
from ..core import reads
from ..core import status as S
from ..core.plan import check_stack, declared_layout
from ..core.stack_config import from_files
from ..core.facts import FactError, parse_facts
from ..core.fitness import with_venv_nccl
from ..core.fitness_baseline import BASELINE_FILE, baseline_document
from ..core.venv import distribution_of, normalize, parse_venv_probe
from . import identity, rehearsal_adapter, ssh
from . import status as remote_status
from .common import changed as _changed
from .common import progress as _progress
from .common import require_target as _require_target
from .common import resource_id
from .installers import sync_files

PIP_TIMEOUT = 1800


def local_client_wheels(specs: list[str], progress: Callable[[str], None]) -> dict[str, Path]:
    """The client's wheels on this machine: the cache, filled by `pip download` (this machine's
    pip cache or PyPI) for the pins it does not have yet. {file name: path}."""
    cache = cache_root() / "bench-client" / "wheels"
    cache.mkdir(parents=True, exist_ok=True)

    def have() -> dict[tuple[str, str], Path]:
        out = {}
        for f in cache.iterdir():
            dist = distribution_of(f.name)
            if dist and f.name.endswith(".whl"):
                out[dist] = f
        return out

    def key(spec: str) -> tuple[str, str]:
        name, _, version = spec.partition("==")
        return normalize(name), version

    missing = [s for s in specs if key(s) not in have()]
    if missing:
        progress(f"bench: downloading {len(missing)} client wheel(s) with pip on this machine")
        # Wheels only (no builds on an offline host), no dependency resolution: the pins are the set.
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "--python-version", "3.11", "-d", str(cache), *missing],
                              capture_output=True, text=True, timeout=PIP_TIMEOUT)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
            raise B.BenchError(f"pip download of the benchmark client's wheels failed (exit {done.returncode}):\n{tail}")
    found = have()
    still = [s for s in specs if key(s) not in found]
    if still:
        raise B.BenchError(f"no wheel for {', '.join(still)} in {cache}")
    return {found[key(s)].name: found[key(s)] for s in specs}


def install_rehearsal_client(t: ssh.Target, python: str, progress: Callable[[str], None]) -> None:
    """Push the pinned client wheels and install them (no index, no dependency resolution) into
    their own directory; skipped when that directory already holds exactly these pins."""
    specs = B.parse_requirements(rehearsal_adapter.bench_client_requirements())
    digest = hashlib.sha256("\n".join(specs).encode()).hexdigest()
    marker = ssh.read_file(t, f"{B.CLIENT_DIR}/{B.CLIENT_MARKER}")
    if marker is not None and marker.decode(errors="replace").strip() == digest:
        return
    files = local_client_wheels(specs, progress)
    pushed = sync_files(t, files, B.CLIENT_WHEELS_DIR)
    if pushed:
        progress(f"bench: pushed {len(pushed)} client wheel(s) to {B.CLIENT_WHEELS_DIR}")
    progress(f"bench: installing the benchmark client ({specs[0]} + {len(specs) - 1} pinned packages) into {B.CLIENT_DIR}")
    ssh.run(t, ["rm", "-rf", "--", B.CLIENT_DIR], purpose="clearing the benchmark client", timeout=120)
    ssh.run(t, [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-deps",
                "--find-links", B.CLIENT_WHEELS_DIR, "--target", B.CLIENT_DIR, *specs],
            purpose="installing the benchmark client", timeout=PIP_TIMEOUT)
    ssh.write_file(t, f"{B.CLIENT_DIR}/{B.CLIENT_MARKER}", (digest + "\n").encode(), 0o644)


def probe_client(t: ssh.Target, python: str, client: str) -> dict:
    env = [f"{k}={v}" for k, v in sorted(B.client_environment(client).items())]
    res = ssh.run(t, ["env", *env, python, "-c", B.CLIENT_PROBE], purpose="reading the benchmark client", timeout=60,
                  check=False)
    try:
        found = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise B.BenchError(f"{python} on {t.label} did not run (exit {res.rc}): is the venv deployed? "
                           f"{(res.stderr or res.stdout).strip()[-300:]}") from None
    if not found.get("module"):
        hint = ("the venv's sglang is the rehearsal engine, which has no benchmark client: set "
                "gpu-serving:benchmark.client: rehearsal" if "rehearsal" in str(found.get("version")) else
                "install an sglang that ships bench_serving in the venv (gpu-serving:venv.packages)")
        raise B.BenchError(f"no SGLang serving benchmark importable by {python} on {t.label} "
                           f"(sglang {found.get('version')} at {found.get('path')}): {hint}")
    return found


def run_bench(project_dir: Path, stack: str, progress: Callable[[str], None] = print,
              results_root: Optional[Path] = None, flags: Optional[dict] = None) -> tuple[Path, dict]:
    """Benchmark the stack's serving server on its (first) host; returns (result dir, meta).
    `flags`: the command's --concurrency, --input-len, --output-len over the stack's settings."""
    checked = check_stack(stack, from_files(project_dir, stack), project_dir)
    (entry, plan), (_, settings) = checked.plans[0], checked.settings.per_host()[0]
    benchmark = B.with_flags(settings.benchmark, **(flags or {}))  # refused before any host is reached
    try:
        conn = remote_status.connection(settings, stack, project_dir, checked)
    except remote_status.StatusError as exc:
        raise B.BenchError(str(exc)) from None
    spec = B.host_spec(stack=stack, settings=settings, plan=plan, entry=entry, declared=declared_layout(plan))
    spec["benchmark"] = benchmark.model_dump(by_alias=True)
    return run_on_host(ssh.Target.from_props({"connection": conn}), spec, results_root or project_dir / B.RESULTS_DIR,
                       progress)


def fitness_now(t: ssh.Target, spec: dict) -> Optional[dict]:
    """The host's fitness facts (the host-facts read) with the NCCL of the serving venv (its
    read), recorded in meta.json as the run's baseline; None when they cannot be read (the run
    goes on: a figure without a baseline is compared as "unknown", never refused)."""
    try:
        facts = parse_facts(ssh.fetch(t, reads.host_facts({"cudaHome": spec.get("cudaHome", "/usr/local/cuda")})[0]).stdout)
        venv = parse_venv_probe(ssh.fetch(t, reads.python_venv({"path": spec["python"].rsplit("/bin/", 1)[0]})[0]).stdout)
    except (ssh.RemoteError, FactError):
        return None
    return with_venv_nccl(facts.fitness, venv.packages).as_dict() if facts.fitness else None


def run_on_host(t: ssh.Target, spec: dict, results_root: Path, progress: Callable[[str], None]) -> tuple[Path, dict]:
    """The benchmark of one host (`spec`: core.bench.host_spec), its files kept under
    results_root/<stack>/<UTC time>/; returns (that folder, its meta.json)."""
    bench = B.settings_of(spec)
    stack, unit, target = spec["stack"], spec["unit"], spec["target"]

    # Readiness first, read as `status` reads it: the stack's own unit must serve, ready, in the
    # declared layout.
    host = S.parse_serving(ssh.fetch(t, reads.serving()).stdout)
    serving = host.serving[0] if host.serving else None
    ours = serving is not None and serving.name == unit
    report = remote_status._readiness(t, serving, spec["declared"]) if ours and serving is not None else None
    why = B.refusal(stack, unit, target, (serving.name, serving.stack) if serving else None, report)
    if why:
        raise B.BenchError(why)
    assert serving is not None and report is not None  # B.refusal refused a host where the unit is not ready

    python = spec["python"]
    if bench.client == "rehearsal":
        install_rehearsal_client(t, python, progress)
    found = probe_client(t, python, bench.client)
    port = int(serving.layout["port"]) if str(serving.layout.get("port", "")).isdigit() else int(spec["port"])
    address = reads.probe_address(str(serving.layout.get("host", spec["bind"])))

    fitness = fitness_now(t, spec)
    started = datetime.now(timezone.utc)
    out_dir = results_root / stack / B.run_name(started)
    remote_dir = f"{B.REMOTE_RUN_DIR}/{stack}-{B.run_name(started)}"
    levels = list(bench.concurrency)
    progress(f"bench {stack}: {spec['describe']} on {target}, {found['module']} {found['version']} "
             f"({'rehearsal client' if bench.client == 'rehearsal' else 'the venv'}), levels {levels}, "
             f"random-ids {bench.input_len} in / {bench.output_len} out")
    ssh.run(t, ["mkdir", "-p", "--", remote_dir], purpose="creating the benchmark directory", timeout=60)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = []
    try:
        for i, c in enumerate(levels, 1):
            remote_file = f"{remote_dir}/c{c}.jsonl"
            argv = B.level_argv(python=python, module=found["module"], client=bench.client, address=address, port=port,
                                model_path=spec["model"]["path"], served_name=None, settings=bench, concurrency=c,
                                output_file=remote_file)
            progress(f"  level {i}/{len(levels)}: concurrency {c}, {B.prompts(bench, c)} prompts ...")
            t0 = time.monotonic()
            res = ssh.run(t, B.level_script(argv, remote_file), purpose=f"benchmark level {c}",
                          timeout=bench.timeout_seconds, check=False)
            data = ssh.read_file(t, remote_file)
            if res.rc != 0 or data is None:
                tail = "\n".join((res.stdout + "\n" + res.stderr).strip().splitlines()[-15:])
                raise B.BenchError(f"the benchmark at concurrency {c} failed on {target} (exit {res.rc}):\n{tail}")
            (out_dir / f"c{c}.jsonl").write_bytes(data)
            summary = B.summarize(B.last_record(data.decode()))
            summaries.append(summary)
            progress(B.progress_line(i, len(levels), c, summary, time.monotonic() - t0))
    finally:
        ssh.run(t, ["rm", "-rf", "--", remote_dir], purpose="removing the benchmark directory", timeout=60, check=False)
    server_version = report.get("version") or (summaries[0].get("server_version") if summaries else None)
    rehearsal = B.is_rehearsal(server_version, bool(spec["rehearsalHost"]))
    doc = B.meta(stack=stack, strategy=spec["strategy"], layout=spec["declared"] | {"describe": spec["describe"]},
                 host=spec["hostLabel"], model=spec["model"], sglang_version=found["version"],
                 client_module=found["module"], server_version=server_version, rehearsal=rehearsal, started=started,
                 finished=datetime.now(timezone.utc), settings=bench, levels=summaries, fitness=fitness)
    (out_dir / "meta.json").write_text(json.dumps(doc, indent=2) + "\n")
    if fitness:
        keep_baseline(t, stack, f"{stack}/{out_dir.name}", started, spec["hostLabel"], fitness, progress)
    return out_dir, doc


def keep_baseline(t: ssh.Target, stack: str, run: str, started: datetime, host: str, fitness: dict,
                  progress: Callable[[str], None]) -> None:
    """The run's fitness as the host's baseline (core/fitness_baseline.py), kept on the host where
    every checkout's drift check and switch read it; a host that refuses the write keeps its old
    baseline, and the run its figures (said, never a failure of the run)."""
    try:
        ssh.run(t, ["mkdir", "-p", "--", BASELINE_FILE.rsplit("/", 1)[0]], purpose="creating /var/lib/gpu-serving", timeout=60)
        ssh.write_file(t, BASELINE_FILE, baseline_document(stack=stack, run=run, date=started.isoformat(timespec="seconds"),
                                                           host=host, fitness=fitness).encode(), 0o644)
    except ssh.RemoteError as exc:
        progress(f"bench {stack}: warning: the host's fitness baseline was not written ({exc}): the drift check and "
                 f"readiness.fitness still compare with the one before")
        return
    progress(f"bench {stack}: the host's fitness is now its baseline ({BASELINE_FILE}): the drift check compares with it")


# ---------------------------------------------------------------------------------------
# The Benchmark resource's inputs that say which server it measured: a change of any of them
# (the unit or its layout, a start of the server by this program, the benchmark's own settings,
# the host) is a new measurement. Not compared: where the results go on this machine, and the
# readiness outputs (re-read on every refresh; they gate a run, they do not ask for one).
BENCHMARK_TRIGGERS = ["unit", "unitConfig", "started", "declared", "benchmark", "connection"]


@identity.guarded
class BenchmarkProvider(ResourceProvider):
    """`benchmark.onDeploy`: SGLang's serving benchmark after readiness, in `pulumi up` (never
    in a preview: the engine calls no create or update there). Its output `summary` is the stack
    output `benchmark`. A benchmark that fails (or may not run) is recorded in the summary and
    said in the log; it never fails the update, so a ready server is never rolled back for it.
    A refresh reads nothing: a summary is a record of a run, not a state of the host.

    props: connection, the host's benchmark spec (core.bench.host_spec: stack, unit, declared,
    benchmark, ...), unitConfig (the unit's rendered files, hashed), started (when this program
    last started the server: the service's readiness check), readinessStatus and mismatches
    (the readiness resource's verdict), projectDir and resultsDir (this machine's folders)."""

    def _run(self, props: dict) -> dict:
        spec = B.DeployBenchmarkSpec.from_props(props)
        who, unit = spec.who, spec.unit
        why = B.readiness_refusal(spec.readiness_status, spec.mismatches)
        if why:
            _progress(f"{who}warning: benchmark not run: {why}")
            return B.failed_summary(why, rehearsal=spec.rehearsal_host)
        project = Path(spec.project_dir)
        root = project / spec.results_dir
        _progress(f"{who}benchmark (benchmark.onDeploy): SGLang's serving benchmark against {unit}")
        key = ""
        try:
            t = _require_target(props)
            key = t.private_key
            out_dir, doc = run_on_host(t, props, root, lambda m: _progress(who + m))
        except Exception as exc:  # noqa: BLE001 - any failure of a measurement leaves the server as it is
            secrets = [key, key.strip()]
            reason = ssh.redact(f"{type(exc).__name__}: {exc}" if not isinstance(exc, (B.BenchError, ssh.RemoteError))
                                else str(exc), secrets)
            _progress(f"{who}warning: the benchmark failed; {unit} stays deployed and ready: {reason}")
            return B.failed_summary(reason, rehearsal=spec.rehearsal_host)
        folder = os.path.relpath(out_dir, project) if out_dir.is_relative_to(project) else str(out_dir)
        summary = B.deploy_summary(doc, folder)
        _progress(f"{who}benchmark: results in {folder}" +
                  (" (REHEARSAL: performance model, not a GPU measurement)" if summary["rehearsal"] else ""))
        return summary

    def create(self, props):
        return CreateResult(id_=resource_id(props, B.DeployBenchmarkSpec.from_props(props).unit, "benchmark"),
                            outs={**props, "summary": self._run(props)})

    def update(self, id, olds, news):
        return UpdateResult(outs={**news, "summary": self._run(news)})

    def diff(self, id, olds, news):
        changed = _changed(olds, news, BENCHMARK_TRIGGERS)
        if (olds.get("summary") or {}).get("status") != "done":
            changed.append("summary")  # the last one failed or never ran: the next `up` tries again
        return DiffResult(changes=bool(changed), replaces=[], stables=[])

    def read(self, id, props):
        return ReadResult(id_=id, outs=props)

    def delete(self, id, props):
        pass  # the results stay in the results folder: they are the operator's record
