"""``python -m components bench --stack NAME``: SGLang's serving benchmark, run on the stack's host
against its ready server (components/remote/bench.py `run_bench`; the pure parts and the result
layout in components/core/bench.py). Named "serving bench" here to keep it apart from the
repository's bench/ folder, the tool benchmark (gpu-serving against other deploy tools); the
command keeps its name, `bench`, which README documents."""
from __future__ import annotations

import sys
from pathlib import Path

from ..core.bench import BenchError
from ..core.errors import ConfigError


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="run SGLang's serving benchmark on the stack's host against its ready server "
                                     "(settings gpu-serving:benchmark); results under results/bench/<stack>/<UTC time>/",
                       description="Run SGLang's own serving benchmark (random-ids prompts, one run per concurrency "
                                   "level) on the stack's host against its serving strategy, which must be ready in the "
                                   "declared layout. The workload is the stack's gpu-serving:benchmark settings; the "
                                   "flags below replace them for this run. Results: results/bench/<stack>/<UTC time>/ "
                                   "(meta.json and SGLang's output file per level), read by `compare` and `advise`. "
                                   "Exit 0 with the results written; 2 on a bad setting or flag, a server not ready, "
                                   "or a failed run.")
    b.add_argument("--stack", required=True, help="the stack whose serving strategy to measure (Pulumi.<stack>.yaml)")
    b.add_argument("--concurrency", metavar="C[,C...]",
                   help="concurrency levels, comma-separated, e.g. 1,32,64 (default: benchmark.concurrency)")
    b.add_argument("--input-len", type=int, metavar="TOKENS", help="input tokens a request (default: benchmark.inputLen)")
    b.add_argument("--output-len", type=int, metavar="TOKENS", help="output tokens a request (default: benchmark.outputLen)")
    b.add_argument("--project-dir", default=".", type=Path, help="directory holding Pulumi.yaml (default: .)")


def run(args) -> int:
    """Exit 0 with the results written; 2 on bad settings or flags, a server not ready, or a
    failed run."""
    # Here, not at the top: only `bench` reaches a host; the other commands load no SSH side.
    from ..remote.bench import run_bench
    from ..remote.ssh import RemoteError
    flags = {"concurrency": args.concurrency, "input_len": args.input_len, "output_len": args.output_len}
    try:
        out_dir, doc = run_bench(args.project_dir, args.stack, progress=lambda line: print(line, flush=True), flags=flags)
    except (ConfigError, BenchError, RemoteError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"results: {out_dir}" + (" (REHEARSAL: performance model, not a GPU measurement)" if doc["rehearsal"] else ""))
    return 0
