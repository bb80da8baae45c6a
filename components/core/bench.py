"""``python -m components bench``: the pure parts (pure: tested with tests/data/bench/).

The benchmark is SGLang's own client (``python -m sglang.benchmark.serving`` where the installed
version has it, else ``python -m sglang.bench_serving``), run ON the host from the host's venv
against the serving server's port on the host side (so the port need not be reachable from
here): dataset ``random-ids`` (no download), the tokenizer from the model directory, one run per
concurrency level, each appending its JSON line to its own ``--output-file``.

Results on this machine: ``results/bench/<stack>/<UTC time>/c<concurrency>.jsonl`` (the client's
lines as written) and ``meta.json`` (stack, layout, host, model, SGLang version, rehearsal or not,
time, settings, and a summary per level). A rehearsal figure says so: ``rehearsal: true``.
"""
from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Optional

from pydantic import ValidationError

from .config import BenchmarkSettings, StackSettings
from .errors import ConfigError, SettingError

if TYPE_CHECKING:
    from .plan import ServingPlan

RESULTS_DIR = "results/bench"
# Timestamp of a run's directory: UTC, sortable, no ':' (a path component on every OS).
TIME_FORMAT = "%Y%m%dT%H%M%SZ"
# Where a run keeps its files on the host while it runs (removed afterwards).
REMOTE_RUN_DIR = "/var/lib/gpu-serving/bench"
# The rehearsal client: wheels pushed here, installed into CLIENT_DIR (first on PYTHONPATH).
CLIENT_WHEELS_DIR = "/var/lib/gpu-serving/bench-client-wheels"
CLIENT_DIR = "/var/lib/gpu-serving/bench-client"
CLIENT_MARKER = ".gpu-serving-requirements"

MODULES = ("sglang.benchmark.serving", "sglang.bench_serving")
# Per metric: the JSON keys bench_serving writes (mean, median, p99).
LATENCIES = ("ttft", "itl", "tpot", "e2e_latency")
THROUGHPUTS = ("request_throughput", "output_throughput", "input_throughput", "total_throughput")

# Which benchmark module the client has and its version, without importing sglang (the real
# package's __init__ pulls in half of its dependencies; find_spec of a top-level name does not).
CLIENT_PROBE = r"""
import importlib.metadata, importlib.util, json, os
spec = importlib.util.find_spec("sglang")
out = {"module": None, "version": None, "path": None}
if spec and spec.origin:
    base = os.path.dirname(spec.origin)
    out["path"] = base
    for mod, rel in (("sglang.benchmark.serving", "benchmark/serving.py"), ("sglang.bench_serving", "bench_serving.py")):
        if os.path.exists(os.path.join(base, rel)):
            out["module"] = mod
            break
    for dist in ("sglang", "sglang-rehearsal"):
        try:
            out["version"] = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            pass
print(json.dumps(out))
"""


class BenchError(Exception):
    """Why a benchmark does not run (or stopped); the message says what to do."""


def refusal(stack: str, unit: str, target: str, serving: Optional[tuple[str, Optional[str]]],
            readiness: Optional[dict[str, Any]]) -> Optional[str]:
    """Why the benchmark must not run, or None. `serving`: (unit, its stack) of what serves on the
    host (None: nothing); `readiness`: the readiness report read now (status reads it the same
    way). Only the stack's own unit, `ready` in the declared layout, is benchmarked."""
    if serving is None or serving[0] != unit:
        now = f"{serving[0]} (stack {serving[1]}) serves" if serving else "nothing serves"
        return (f"stack {stack} does not serve on {target}: {now}; deploy or switch first "
                f"(pulumi up --stack {stack}), then benchmark")
    status = (readiness or {}).get("status")
    if status != "ready":
        return (f"{unit} on {target} is {status}: {(readiness or {}).get('reason')}; a benchmark runs only "
                "against a server that is ready in the declared layout")
    return None


def prompts(settings: BenchmarkSettings, concurrency: int) -> int:
    return settings.prompts_per_concurrency * concurrency


def client_environment(client: str) -> dict[str, str]:
    """Variables the client runs with: offline (random-ids and a local tokenizer need no hub),
    and, for the rehearsal client, its own directory first on the path."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if client == "rehearsal":
        env["PYTHONPATH"] = CLIENT_DIR
    return env


def level_argv(*, python: str, module: str, client: str, address: str, port: int, model_path: str,
               served_name: Optional[str], settings: BenchmarkSettings, concurrency: int, output_file: str) -> list[str]:
    """The command line of one level, as run on the host (through `env`, so the variables are
    the client's only)."""
    env = [f"{k}={v}" for k, v in sorted(client_environment(client).items())]
    argv = ["env", *env, python, "-m", module, "--backend", "sglang", "--host", address, "--port", str(port),
            "--dataset-name", "random-ids", "--model", model_path, "--tokenizer", model_path,
            "--random-input-len", str(settings.input_len), "--random-output-len", str(settings.output_len),
            "--random-range-ratio", repr(float(settings.range_ratio)),
            "--num-prompts", str(prompts(settings, concurrency)), "--max-concurrency", str(concurrency),
            "--request-rate", "inf", "--seed", str(settings.seed), "--output-file", output_file, "--disable-tqdm"]
    if served_name:
        argv[argv.index("--tokenizer"):argv.index("--tokenizer")] = ["--served-model-name", served_name]
    return argv


def level_script(argv: list[str], output_file: str) -> str:
    """Run one level in a fresh output file (bench_serving appends)."""
    return f"rm -f -- {shlex.quote(output_file)} && exec {shlex.join(argv)}"


def last_record(jsonl: str) -> dict[str, Any]:
    """The run's result: the last JSON line of an --output-file."""
    lines = [line for line in jsonl.splitlines() if line.strip()]
    if not lines:
        raise BenchError("the benchmark wrote no result line")
    try:
        # bench_serving writes Infinity for an unbounded request rate: Python's json reads it.
        record = json.loads(lines[-1])
    except ValueError as exc:
        raise BenchError(f"the benchmark's result line is not JSON: {exc}") from None
    if not isinstance(record, dict) or "output_throughput" not in record:
        raise BenchError("the benchmark's result line has no output_throughput")
    return record


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        return None
    return round(float(value), 3)


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """The figures a comparison needs, from one bench_serving result line: throughputs, and
    mean/median/p99 of TTFT, ITL, TPOT and end-to-end latency (ms)."""
    out: dict[str, Any] = {"concurrency": record.get("max_concurrency"), "completed": record.get("completed"),
                           "duration_s": _number(record.get("duration"))}
    for key in THROUGHPUTS:
        out[key] = _number(record.get(key))
    for metric in LATENCIES:
        out[f"{metric}_ms"] = {stat: _number(record.get(f"{stat}_{metric}_ms")) for stat in ("mean", "median", "p99")}
    info = record.get("server_info")
    info = info if isinstance(info, dict) else {}
    out["server_version"] = info.get("version")
    return out


def progress_line(index: int, total: int, concurrency: int, summary: dict[str, Any], seconds: float) -> str:
    ttft, itl = summary["ttft_ms"], summary["itl_ms"]
    def f(x: Optional[float]) -> str:
        return "?" if x is None else f"{x:.1f}"
    return (f"  level {index}/{total}: concurrency {concurrency}: {summary['completed']} requests in {seconds:.0f} s, "
            f"output {f(summary['output_throughput'])} tok/s, TTFT p50 {f(ttft['median'])} ms (p99 {f(ttft['p99'])}), "
            f"ITL p50 {f(itl['median'])} ms")


def is_rehearsal(server_version: Optional[str], host_is_rehearsal: bool) -> bool:
    """A figure from the rehearsal engine, or from any rehearsal host, is never a GPU measurement."""
    return host_is_rehearsal or bool(server_version and "rehearsal" in server_version)


def run_name(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime(TIME_FORMAT)


def meta(*, stack: str, strategy: str, layout: dict[str, Any], host: str, model: dict[str, Any], sglang_version: Optional[str],
         client_module: str, server_version: Optional[str], rehearsal: bool, started: datetime,
         finished: datetime, settings: BenchmarkSettings, levels: list[dict[str, Any]],
         fitness: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """meta.json. `fitness`: the host's fitness facts read as the run started (core/fitness.py),
    the baseline later readings are compared with (core/fitness_baseline.py); None: unread."""
    return {
        "stack": stack, "strategy": strategy, "layout": layout, "host": host, "model": model,
        "sglang_version": sglang_version, "client": {"module": client_module, "kind": settings.client},
        "server_version": server_version, "rehearsal": rehearsal,
        "note": ("rehearsal: the rehearsal engine's performance model, not a GPU measurement" if rehearsal else
                 "measured on the host's GPUs"),
        "time": started.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "finished": finished.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "dataset": "random-ids",
        "settings": {"concurrency": list(settings.concurrency), "inputLen": settings.input_len,
                     "outputLen": settings.output_len, "rangeRatio": settings.range_ratio,
                     "promptsPerConcurrency": settings.prompts_per_concurrency, "seed": settings.seed},
        "levels": levels,
        "fitness": fitness,
    }


REQUIREMENT_LINE = re.compile(r"\A([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)\Z")


def parse_requirements(text: str) -> list[str]:
    """A pinned requirements file (comments and blank lines skipped; every line name==version)."""
    specs = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not REQUIREMENT_LINE.fullmatch(line):
            raise BenchError(f"line {n}: {line!r} is not pinned as name==version")
        specs.append(line)
    if not any(s.lower().startswith("sglang==") for s in specs):
        raise BenchError("the client requirements pin no sglang==VERSION")
    return specs


# ------------------------------------------------------------------ one host's benchmark, as data
# What a benchmark of one stack on one host needs to know, as plain data: built from the plan by
# `components bench` and by the program (the `Benchmark` resource's props, `benchmark.onDeploy`).


def host_label(settings: StackSettings, entry: str) -> str:
    """A run's host as meta.json records it (`host`): where it is reached, and its fleet entry."""
    return settings.host.target + (f" ({entry})" if entry else "")


def host_spec(*, stack: str, settings: StackSettings, plan: ServingPlan, entry: str, declared: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's view of one host of a stack (`settings`: that host's StackSettings,
    `plan`: its ServingPlan, `entry`: the fleet entry's name or "")."""
    target = settings.host.target
    return {
        "stack": stack, "strategy": settings.strategy_name, "unit": plan.unit.name, "declared": declared,
        "describe": plan.layout.describe(), "target": target, "hostLabel": host_label(settings, entry),
        "model": {"name": settings.model.name, "path": settings.model.path},
        "python": f"{settings.venv.path}/bin/python", "bind": settings.serving.host, "port": settings.serving.port,
        "benchmark": settings.benchmark.model_dump(by_alias=True), "rehearsalHost": settings.host.is_rehearsal,
    }


@dataclass(frozen=True)
class DeployBenchmarkSpec:
    """The contract of the Benchmark resource (`benchmark.onDeploy`, core/specs.py says why props
    are one): the host's benchmark spec (`host_spec`), where the results go on this machine, and
    what decides a new run (the unit's files, the server's start) or none (the readiness verdict)."""

    unit: str
    host_entry: str = ""
    rehearsal_host: bool = False
    readiness_status: Any = None
    mismatches: Any = None
    project_dir: str = "."
    results_dir: str = RESULTS_DIR

    @classmethod
    def from_props(cls, props: Any) -> "DeployBenchmarkSpec":
        return cls(unit=str(props.get("unit") or ""), host_entry=str(props.get("hostEntry") or ""),
                   rehearsal_host=bool(props.get("rehearsalHost")), readiness_status=props.get("readinessStatus"),
                   mismatches=props.get("mismatches"), project_dir=str(props.get("projectDir") or "."),
                   results_dir=str(props.get("resultsDir") or RESULTS_DIR))

    @property
    def who(self) -> str:
        return f"hosts[{self.host_entry}]: " if self.host_entry else ""


def settings_of(spec: dict[str, Any]) -> BenchmarkSettings:
    return BenchmarkSettings.model_validate(spec["benchmark"])


# `python -m components bench` flags over the stack's gpu-serving:benchmark settings.
FLAGS = {"concurrency": "--concurrency", "inputLen": "--input-len", "outputLen": "--output-len"}


def with_flags(benchmark: BenchmarkSettings, *, concurrency: Optional[str] = None, input_len: Optional[int] = None,
               output_len: Optional[int] = None) -> BenchmarkSettings:
    """The stack's benchmark settings with what the flags give for this run, checked by the
    settings' own rules; a `ConfigError` names the flag and the rule."""
    given: dict[str, Any] = {}
    problems = []
    if concurrency is not None:
        try:
            given["concurrency"] = [int(x) for x in concurrency.split(",") if x.strip()]
        except ValueError:
            problems.append(SettingError("--concurrency", f"{concurrency!r} is not a list of numbers",
                                         "give concurrent requests separated by commas, e.g. --concurrency 1,32,64"))
    if input_len is not None:
        given["inputLen"] = input_len
    if output_len is not None:
        given["outputLen"] = output_len
    try:
        checked = BenchmarkSettings.model_validate({**benchmark.model_dump(by_alias=True), **given})
    except ValidationError as exc:
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            problems.append(SettingError(FLAGS.get(field, f"gpu-serving:benchmark.{field}"),
                                         err["msg"].removeprefix("Value error, ")))
    else:
        if not problems:
            return checked
    raise ConfigError(problems, "python -m components bench")


# The figures of each level the stack output `benchmark` carries (a level summary's keys).
OUTPUT_LATENCIES = tuple(f"{m}_ms" for m in LATENCIES)


def deploy_summary(doc: dict[str, Any], results: str) -> dict[str, Any]:
    """The stack output `benchmark` of a run (`doc`: its meta.json; `results`: its folder, as
    the operator finds it): per concurrency, output tok/s and TTFT/ITL/TPOT/e2e mean, median
    and p99, with the rehearsal flag and the SGLang version beside every figure."""
    levels = {}
    for level in doc.get("levels") or []:
        c = level.get("concurrency")
        levels[str(c)] = {"output_throughput": level.get("output_throughput"),
                          "request_throughput": level.get("request_throughput"), "completed": level.get("completed"),
                          **{k: level.get(k) for k in OUTPUT_LATENCIES}}
    return {"status": "done", "rehearsal": bool(doc.get("rehearsal")), "note": doc.get("note"),
            "sglang_version": doc.get("sglang_version"), "server_version": doc.get("server_version"),
            "client": (doc.get("client") or {}).get("module"), "layout": (doc.get("layout") or {}).get("describe"),
            "time": doc.get("time"), "results": results, "levels": levels}


def failed_summary(reason: str, *, rehearsal: bool, results: Optional[str] = None) -> dict[str, Any]:
    """The stack output `benchmark` when the benchmark did not run or stopped: the server stays
    deployed (a benchmark is a measurement of it, not a condition of it)."""
    return {"status": "failed", "reason": reason, "rehearsal": rehearsal, "results": results, "levels": {},
            "note": "the server is deployed and ready; `python -m components bench` runs the benchmark again"}


def readiness_refusal(status: Optional[str], mismatches: Any) -> Optional[str]:
    """Why `pulumi up` must not benchmark after readiness (the readiness resource's outputs), or None."""
    if status != "ready":
        return f"readiness is {status!r}, not 'ready': no benchmark against a server that is not ready"
    if mismatches:
        return f"the server does not run the declared layout ({mismatches}): no benchmark"
    return None
