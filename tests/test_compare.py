"""`components compare` on stored benchmark runs (issue 15.2): SGLang's own output files under
tests/data/compare/<case>/results/bench/<stack>/<UTC time>/, as `components bench` keeps them.

- seed: the operator's PCIe host (../shared/notes/sglang.md: TP8 ≈ 26 tok/s at 1 and ≈ 808 at
  32; PP8 ≈ 37 at 1, ≈ 396 at 64); two TP8 runs (the newer wins per level, the older one alone
  has C=16), PP8's C=1 file holds two appended runs (the last line wins).
- rehearsal: the rehearsal engine (version 0.0.1+rehearsal); EP8 has only C=32 and its
  meta.json lacks the rehearsal flag.
- bench-rehearsal: a real run of tests/e2e/test_bench.py (`components bench` with the real
  SGLang 0.5.9 client against the rehearsal engine, files as bench wrote them); the picture of
  docs/choosing-a-strategy.md, docs/img/compare-rehearsal.png, is drawn from it.
Each case's expected.txt is the golden table.
"""
from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest

from components.cli import compare as cli_compare
from components.__main__ import main
from components.core import compare
from components.core.bench_results import BenchResultError, load_runs, parse_output_file

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "compare"
SEED = DATA / "seed" / "results" / "bench"
REHEARSAL = DATA / "rehearsal" / "results" / "bench"


def test_sglang_output_file_parses_with_its_own_field_names():
    path = SEED / "tp8" / "2026-12-01T101500Z" / "c32.jsonl"
    raw = json.loads(path.read_text())
    [level] = parse_output_file(path.read_text(), "c32.jsonl")
    assert level.concurrency == raw["max_concurrency"] == 32
    assert level.output_throughput == raw["output_throughput"] == 808.4
    assert (level.median_ttft_ms, level.p99_ttft_ms, level.median_itl_ms) == (1890.0, 5120.0, 36.2)
    assert level.completed == raw["completed"] == 160
    assert level.request_throughput == pytest.approx(raw["completed"] / raw["duration"])
    # SGLang writes request_rate inf as the JSON extension Infinity: it must read.
    assert math.isinf(level.raw["request_rate"]) and level.raw["server_info"]["tp_size"] == 8


def test_runs_oldest_first_and_the_last_appended_line_wins():
    tp8 = load_runs(SEED, "tp8")
    assert [r.folder for r in tp8] == ["2026-11-30T091200Z", "2026-12-01T101500Z"]
    assert sorted(tp8[0].levels) == [1, 16] and sorted(tp8[1].levels) == [1, 32, 64]
    assert (tp8[1].host, tp8[1].model, tp8[1].sglang_version, tp8[1].rehearsal) == ("gpu1", "/models/Kimi-K2.6",
                                                                                     "0.5.23", False)
    [pp8] = load_runs(SEED, "pp8")
    assert len((SEED / "pp8" / pp8.folder / "c1.jsonl").read_text().splitlines()) == 2
    assert pp8.levels[1].output_throughput == 37.2  # the second line, not the first (35.8)
    assert load_runs(SEED, "ep8") == []


def test_newest_run_wins_per_level_and_an_older_level_stays():
    c = compare.load(SEED, ["tp8", "pp8"])
    tp8 = c.series[0]
    assert tp8.points[1].run.folder == "2026-12-01T101500Z" and tp8.points[1].level.output_throughput == 26.1
    assert tp8.points[16].run.folder == "2026-11-30T091200Z"
    assert tp8.dates == "2026-11-30..2026-12-01"
    assert c.concurrencies == [1, 16, 32, 64]


@pytest.mark.parametrize("case, stacks", [("seed", "tp8,pp8,ep8"), ("rehearsal", None), ("bench-rehearsal", "tp8,pp8")])
def test_golden_table(case, stacks, monkeypatch):
    monkeypatch.chdir(DATA / case)  # the messages name the results folder as given
    c = compare.load(Path("results/bench"), stacks.split(",") if stacks else None)
    assert compare.render(c) == (DATA / case / "expected.txt").read_text()


def test_winner_at_each_concurrency_and_by_how_much():
    lines = [v.text() for v in compare.verdicts(compare.load(SEED, ["tp8", "pp8"]))]
    assert lines == [
        "C=1: PP8 wins with 37.2 tok/s, +43 % (1.43x) over TP8 (26.1)",
        "C=16: only TP8 has results (455 tok/s), nothing to compare",
        "C=32: TP8 wins with 808 tok/s, +130 % (2.30x) over PP8 (352)",
        "C=64: TP8 wins with 871 tok/s, +120 % (2.20x) over PP8 (396)",
    ]
    reh = {v.concurrency: v for v in compare.verdicts(compare.load(REHEARSAL, ["tp8", "pp8", "ep8"]))}
    assert [s.strategy for s, _ in reh[1].ranked] == ["PP8", "TP8"]  # the seed's finding, on the rehearsal host
    # 802 vs 790 tok/s is within run-to-run noise: no winner is named.
    assert reh[32].text() == "C=32: EP8 and TP8 tie (802 vs 790 tok/s, within 2 %)"


def test_a_lower_ttft_elsewhere_is_said():
    c = compare.load(SEED, ["tp8", "pp8"])
    # Make PP8 quicker to the first token at C=32 while TP8 still has the throughput.
    pp8 = c.series[1]
    lv = pp8.points[32].level
    quick = type(lv)(**{**lv.__dict__, "median_ttft_ms": 900.0})
    pp8.points[32] = compare.Point(quick, pp8.points[32].run)
    v = next(v for v in compare.verdicts(c) if v.concurrency == 32)
    assert v.text().endswith("; lowest TTFT p50: PP8 (900 ms vs 1,890 ms)")


def test_rehearsal_is_never_a_gpu_measurement():
    c = compare.load(REHEARSAL, None)
    ep8 = next(s for s in c.series if s.stack == "ep8")
    meta = json.loads((REHEARSAL / "ep8" / "2026-12-02T083000Z" / "meta.json").read_text())
    assert "rehearsal" not in meta  # only the engine's version tells
    assert ep8.rehearsal and ep8.label().endswith("(rehearsal)") and ep8.versions == "0.0.1+rehearsal"
    assert c.banner().startswith("REHEARSAL: EP8, PP8, TP8 ") and "not a GPU measurement" in c.banner()
    assert compare.render(c).startswith("REHEARSAL: ")
    assert compare.load(SEED, None).banner() is None


def test_rehearsal_beside_gpu_figures_is_called_out():
    c = compare.build({"tp8": load_runs(SEED, "tp8"), "pp8": load_runs(REHEARSAL, "pp8")})
    assert c.mixed and c.banner().startswith("REHEARSAL: PP8 ")
    warnings = c.warnings()
    assert "PP8 measured on the rehearsal engine, TP8 on GPUs: these figures do not compare" in warnings
    assert any("different hosts" in w for w in warnings) and any("different models" in w for w in warnings)


def test_the_figure_has_one_line_per_strategy_on_both_plots(tmp_path):
    c = compare.load(REHEARSAL, ["tp8", "pp8", "ep8"])
    fig = cli_compare.figure(c)
    throughput, ttft = fig.axes
    assert throughput.get_xlabel().startswith("concurrency") and "tok/s" in throughput.get_ylabel()
    assert "TTFT" in ttft.get_ylabel()
    for ax, field in ((throughput, "output_throughput"), (ttft, "median_ttft_ms")):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines) == [s.label() for s in c.series]
        assert all("on 10.213.4.2, rehearsal engine 0.0.1+rehearsal, 2026-12-02 (rehearsal)" in k for k in lines)
        for s in c.series:
            line = lines[s.label()]
            assert list(line.get_xdata()) == sorted(s.points)
            assert list(line.get_ydata()) == [getattr(s.points[x].level, field) for x in sorted(s.points)]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "32"]
    [legend] = fig.legends  # one, under both plots
    assert [t.get_text() for t in legend.get_texts()] == [s.label() for s in c.series]
    title = fig.get_suptitle()
    assert title.startswith("REHEARSAL: ") and "kimi-k2.6" in title
    png = cli_compare.write_png(fig, tmp_path / "out" / "compare.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1320, 660)  # 12 x 6 inches at 110 dpi
    assert 30_000 < len(data) < 1_000_000


def test_cli_prints_the_table_and_writes_the_png(tmp_path, capsys):
    out = tmp_path / "seed.png"
    assert main(["compare", "--results", str(SEED), "--stacks", "tp8,pp8,ep8", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "  C=1: PP8 wins with 37.2 tok/s" in text and "missing: ep8: no benchmark results" in text
    assert "python -m components bench --stack ep8" in text
    assert text.rstrip().endswith(f"picture: {out}") and out.read_bytes()[:4] == b"\x89PNG"
    assert main(["compare", "--results", str(REHEARSAL), "--output", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rehearsal"] is True and [s["stack"] for s in doc["strategies"]] == ["ep8", "pp8", "tp8"]
    assert doc["winners"][0] == {"concurrency": 1, "ranking": ["PP8", "TP8"],
                                 "verdict": "C=1: PP8 wins with 36.5 tok/s, +44 % (1.44x) over TP8 (25.4)"}


def test_cli_default_results_folder_is_the_projects(tmp_path, capsys):
    shutil.copytree(SEED, tmp_path / "results" / "bench")
    assert main(["compare", "--project-dir", str(tmp_path)]) == 0
    assert (tmp_path / "results" / "bench" / "compare.png").is_file()
    assert "C=64: TP8 wins" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--stacks", "ep8"], "error: no benchmark results for ep8 under"),
    (["--stacks", " , "], "a comma-separated list of stack names is needed (e.g. --stacks tp8,pp8,ep8)"),
    (["--stacks", "../tp8"], "a comma-separated list of stack names is needed"),
])
def test_cli_refuses_with_a_reason(args, message, capsys, tmp_path):
    assert main(["compare", "--results", str(SEED), "--output", str(tmp_path / "x.png"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (tmp_path / "x.png").exists()


def test_nothing_stored_at_all(tmp_path, capsys):
    assert main(["compare", "--results", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "no benchmark results for any stack" in err and "python -m components bench --stack <stack>" in err


def test_partial_runs_leave_out_what_is_broken_and_say_so(tmp_path):
    """A level cut short (a partial last line), a level where nothing completed, a run without
    meta.json and an empty run folder: the rest still compares, each gap named."""
    results = tmp_path / "bench"
    shutil.copytree(SEED, results)
    run = results / "tp8" / "2026-12-01T101500Z"
    c64 = run / "c64.jsonl"
    c64.write_text(c64.read_text()[:300])  # the client was killed mid-write
    c32 = json.loads((run / "c32.jsonl").read_text())
    (run / "c32.jsonl").write_text(json.dumps({**c32, "completed": 0, "output_throughput": 0.0}) + "\n")
    pp8 = results / "pp8" / "2026-12-01T133000Z"
    (pp8 / "meta.json").unlink()
    (results / "ep8" / "2026-12-03T000000Z").mkdir(parents=True)
    c = compare.load(results, ["tp8", "pp8", "ep8"])
    tp8 = c.series[0]
    assert tp8.points[1].run.folder == "2026-12-01T101500Z"
    # C=32 and C=64 of the newest run are gone; no older run has them.
    assert sorted(tp8.points) == [1, 16]
    notes = "\n".join(c.notes)
    assert "tp8/2026-12-01T101500Z/c64.jsonl:1: not JSON" in notes and "delete the file or rerun" in notes
    assert "c32.jsonl:1: no request completed at concurrency 32 (completed 0, 0 tok/s): left out" in notes
    assert "pp8/2026-12-01T133000Z has no meta.json" in notes
    pp8_series = c.series[1]
    # Without meta.json the server's own /server_info (recorded by the client) names model, version, layout.
    assert (pp8_series.models, pp8_series.versions, pp8_series.newest.layout) == ("Kimi-K2.6", "0.5.23",
                                                                                  "tp 1, pp 8, ep 1, dp 1")
    assert pp8_series.hosts == "unknown host" and pp8_series.dates == "2026-12-01"
    assert c.missing == [f"ep8: no completed level in 1 run(s) under {results}/ep8 "
                         f"(run `python -m components bench --stack ep8` while it serves)"]
    text = compare.render(c)
    assert "C=32: only PP8 has results (352 tok/s), nothing to compare" in text
    assert "note: " in text and "missing: ep8" in text


def test_a_pretty_printed_result_reads_as_one_level():
    """A bench that stores SGLang's result object re-indented (one JSON document) reads the same."""
    text = (SEED / "pp8" / "2026-12-01T133000Z" / "c32.jsonl").read_text()
    [level] = parse_output_file(json.dumps(json.loads(text), indent=2), "c32.json")
    assert (level.concurrency, level.output_throughput, level.source) == (32, 351.7, "c32.json")
    both = parse_output_file(json.dumps([json.loads(text), json.loads(text)], indent=1), "list.json")
    assert [lv.source for lv in both] == ["list.json[0]", "list.json[1]"]


@pytest.mark.parametrize("line, message", [
    ('{"max_concurrency": 4, "completed": 20}', "lacks output_throughput, median_ttft_ms, p99_ttft_ms, median_itl_ms"),
    ('"done"', "not a JSON object of SGLang's benchmark output"),
    ('{"max_concurrency": null, "completed": 5, "output_throughput": 9.0, "median_ttft_ms": 1, "p99_ttft_ms": 2,'
     ' "median_itl_ms": 3}', "a comparison needs a run limited by --max-concurrency N"),
    ('{"max_concurrency": 4, "completed": 5, "output_throughput": "fast", "median_ttft_ms": 1, "p99_ttft_ms": 2,'
     ' "median_itl_ms": 3}', "field 'output_throughput' is 'fast', not a number"),
])
def test_malformed_lines_name_the_file_and_the_field(line, message):
    with pytest.raises(BenchResultError, match="^c4.jsonl:1: ") as exc:
        parse_output_file(line + "\n", "c4.jsonl")
    assert message in str(exc.value)


def test_a_meta_json_that_is_not_json_stops_with_the_path(tmp_path, capsys):
    results = tmp_path / "bench"
    shutil.copytree(SEED, results)
    (results / "pp8" / "2026-12-01T133000Z" / "meta.json").write_text("{")
    assert main(["compare", "--results", str(results), "--output", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "pp8/2026-12-01T133000Z/meta.json: not JSON" in err and "rerun `components bench --stack pp8`" in err


def test_other_commands_never_load_matplotlib():
    """Only drawing the picture imports it: `plan`, `status` and the Pulumi program start as fast as before."""
    import subprocess
    import sys
    code = ("import sys, components.__main__, components.program; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip() == "[]"


def test_a_run_as_components_bench_writes_it_reads_back(tmp_path):
    """The writer (components/core/bench.py: meta.json + c<C>.jsonl) and this reader agree: the
    real client's output of tests/data/bench/ stored as `bench` stores it, meta.json from `meta()`."""
    from datetime import datetime, timezone

    from components.core import bench as B
    from components.core.config import parse_settings

    lines = (Path(__file__).parent / "data" / "bench" / "sglang-0.5.9-rehearsal-tp8-c1-c32.jsonl").read_text().splitlines()
    settings = parse_settings("tp8", {"model": {"profile": "kimi-k2.6"}, "host": {"rehearsal": "x"},
                                      "strategy": {"tpSize": 8}, "benchmark": {"concurrency": [1, 32]}})
    started = datetime(2026, 12, 1, 3, 0, 0, tzinfo=timezone.utc)
    run = tmp_path / "bench" / "tp8" / B.run_name(started)
    run.mkdir(parents=True)
    records = [json.loads(line) for line in lines]
    for line, record in zip(lines, records):
        (run / f"c{record['max_concurrency']}.jsonl").write_text(line + "\n")
    layout = {"tp_size": 8, "pp_size": 1, "ep_size": 8, "dp_size": 1, "enable_dp_attention": False,
              "model_path": "/srv/models/kimi-k2.6", "served_model_name": "kimi-k2.6", "port": 30000}
    doc = B.meta(stack="tp8", strategy=settings.strategy_name, layout=layout | {"describe": "tp 8, pp 1, ep 8, dp 1"},
                 host="10.213.4.2", model={"name": settings.model.name, "path": settings.model.path},
                 sglang_version="0.5.9", client_module="sglang.bench_serving", server_version="0.0.1+rehearsal",
                 rehearsal=True, started=started, finished=started, settings=settings.benchmark,
                 levels=[B.summarize(r) for r in records])
    (run / "meta.json").write_text(json.dumps(doc, indent=2) + "\n")

    [got] = load_runs(tmp_path / "bench", "tp8")
    assert (got.strategy, got.layout, got.model, got.host) == ("TP8", "tp 8, pp 1, ep 8, dp 1", settings.model.name,
                                                               "10.213.4.2")
    assert (got.sglang_version, got.rehearsal, got.date, got.notes) == ("0.5.9", True, "2026-12-01", ())
    assert got.server_version == "0.0.1+rehearsal" and got.settings["inputLen"] == settings.benchmark.input_len
    assert sorted(got.levels) == [1, 32]
    for record in records:
        level = got.levels[record["max_concurrency"]]
        assert (level.output_throughput, level.median_ttft_ms) == (record["output_throughput"], record["median_ttft_ms"])
    c = compare.load(tmp_path / "bench", ["tp8"])
    # The legend names what served (the rehearsal engine), not the benchmark client (SGLang 0.5.9).
    assert c.series[0].label() == "TP8 on 10.213.4.2, rehearsal engine 0.0.1+rehearsal, 2026-12-01 (rehearsal)"
    # SGLang's own record of the lengths (128 / 32 in this file) wins over meta.json's settings.
    assert c.title() == (f"{settings.model.name}: SGLang serving benchmark, 128 in + 32 out tokens a request, "
                         "5 prompts per concurrent request")


def test_the_png_shows_c1_off_the_axis_with_the_workload_and_the_servers_version():
    """Issue 36.19, on the docs picture's runs (tests/data/compare/bench-rehearsal): the C=1
    throughput (24 tok/s beside 690) sat on the axis line, the title did not say the workload,
    and the legend named the benchmark client's SGLang (0.5.9) for a run served by the rehearsal
    engine. Now: concurrency and throughput on log axes, every point clear of the frame, the
    request lengths and prompts a level in the title, the server's version in the legend."""
    c = compare.load(DATA / "bench-rehearsal" / "results" / "bench", ["tp8", "pp8"])
    fig = cli_compare.figure(c)
    throughput, ttft = fig.axes
    assert throughput.get_xscale() == "log" and throughput.get_yscale() == "log" and ttft.get_xscale() == "log"
    for ax in (throughput, ttft):
        for line in ax.get_lines():
            for x, y in zip(line.get_xdata(), line.get_ydata()):
                ax_x, ax_y = ax.transAxes.inverted().transform(ax.transData.transform((x, y)))
                assert 0.05 < ax_x < 0.95 and 0.05 < ax_y < 0.95, (ax.get_title(), line.get_label(), x, y, ax_x, ax_y)
    title = fig.get_suptitle()
    assert "64 in + 16 out tokens a request, 5 prompts per concurrent request" in title, title
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert all("rehearsal engine 0.0.1+rehearsal" in label and "0.5.9" not in label for label in labels), labels
    gpu = compare.load(SEED, ["tp8", "pp8"])
    assert all(", SGLang 0.5.23, " in s.label() for s in gpu.series)


def _seed_with_fitness(tmp_path: Path, host: str = "gpu1") -> tuple[Path, dict]:
    """The seed's results with the newer TP8 run's meta.json holding the machine's fitness (the
    2-GPU H200 report), as `components bench` records it; and that fitness."""
    from components.core import fitness_read

    from .core.test_fitness_read import sections
    results = tmp_path / "bench"
    shutil.copytree(SEED, results)
    fitness = fitness_read.parse(sections({"fixture": "nvidia/h200-2gpu-nvlink/nvidia-smi-q.xml"}) + "@@end\n").now
    meta_path = results / "tp8" / "2026-12-01T101500Z" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "host": host, "fitness": fitness.as_dict()}) + "\n")
    return results, fitness.as_dict()


def test_a_run_on_a_changed_machine_is_marked_not_comparable(tmp_path):
    import dataclasses

    from components.core.fitness import GpuFitness, HostFitness
    results, then = _seed_with_fitness(tmp_path)
    c = compare.load(results, ["tp8", "pp8"])
    assert compare.hosts_with_fitness(c) == {"gpu1"}  # the other runs recorded none: never read for them
    now = HostFitness.from_dict(then)
    capped = dataclasses.replace(now, gpus=(now.gpus[0], dataclasses.replace(now.gpus[1], power_limit_w=450.0)))
    assert isinstance(capped.gpus[1], GpuFitness)
    marked = compare.with_fitness_now(c, {"gpu1": capped}, [])
    why = "not comparable: GPU 1 (00000000:00:07.0): power limit 700 W -> 450 W"
    assert marked.marks == {"tp8/2026-12-01T101500Z": why}
    text = compare.render(marked)
    assert f"warning: tp8/2026-12-01T101500Z: {why}" in text
    rows = [line for line in text.splitlines() if "tp8/2026-12-01T101500Z" in line and line.strip()[:1].isdigit()]
    assert rows and all(line.endswith("(not comparable)") for line in rows)
    assert "(not comparable)" not in text.split("tp8/2026-11-30T091200Z", 1)[1].splitlines()[0]  # recorded no fitness
    assert compare.as_dict(marked)["not_comparable"] == {"tp8/2026-12-01T101500Z": why}
    # The same machine, or a host not read: nothing marked (unknown is never "not comparable").
    assert compare.with_fitness_now(c, {"gpu1": now}, []).marks == {}
    assert compare.with_fitness_now(c, {"gpu1": None}, ["fitness of gpu1 not read now (x)"]).marks == {}


def test_the_command_reads_the_hosts_of_runs_that_recorded_fitness_and_says_what_it_could_not(tmp_path, capsys):
    """A project whose tp8 stack deploys to a rehearsal host that is not running: the host of the
    run that recorded fitness is looked for, and what kept it from being read is said, not fatal."""
    import os

    import yaml
    name = f"pt{os.getpid()}-none"
    project = tmp_path / "project"
    project.mkdir()
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    doc["config"]["gpu-serving:host"]["value"]["rehearsal"] = name
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    for stack in ("tp8", "pp8"):
        shutil.copy(ROOT / f"Pulumi.{stack}.yaml", project)
    results, _ = _seed_with_fitness(tmp_path, host=f"rehearsal:{name}")
    out = tmp_path / "c.png"
    base = ["compare", "--project-dir", str(project), "--results", str(results), "--stacks", "tp8,pp8", "--output", str(out)]
    assert main(base) == 0
    text = capsys.readouterr().out
    assert f"note: fitness of rehearsal:{name} not read now (the rehearsal host {name!r} is not running" in text
    assert "its figures are not checked against the machine" in text and "not comparable" not in text
    assert main([*base, "--no-host-read"]) == 0
    assert "note: the hosts' fitness was not read (--no-host-read)" in capsys.readouterr().out
