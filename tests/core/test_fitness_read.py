"""The host's fitness now against its baseline (components/core/fitness_read.py): the switch's
check before anything stops, `status`, `compare` and `advise` read it. Cases under
tests/data/fitness-read/ on the real H200 reports (tests/data/nvidia/) with a case's edits; the
script itself run through sh with a stand-in nvidia-smi."""
from __future__ import annotations

import os
import subprocess

import pytest

from components.core import fitness_baseline as FB
from components.core import fitness_read as FR
from components.core import reads

from ..casedata import DATA, cases
from ..test_facts import edited


def sections(side: dict) -> str:
    """The GPUs' sections of the answer, as the script prints them (a real report with edits)."""
    xml = edited((DATA / side["fixture"]).read_text(), side.get("edit", []))
    return f"@@fitness\n{xml.rstrip()}\n@@iommu\n{side.get('iommu', '')}\n@@nccl\n{side.get('nccl', '')}\n"


def answer(case: dict) -> str:
    if "answer" in case:
        return case["answer"]
    text = "@@baseline\n"
    if case.get("baseline"):
        b = case["baseline"]
        fitness = FR.parse(sections(b["side"]) + "@@end\n").now
        text += FB.baseline_document(stack=b["stack"], run=b["run"], date=b["date"], host=b["host"], fitness=fitness.as_dict())
    text += case.get("baseline_text", "")
    if case.get("now"):
        text += sections(case["now"])
    return text + "@@end\n"


@pytest.mark.parametrize("name,case", cases("fitness-read"), ids=lambda x: x if isinstance(x, str) else "")
def test_fitness_read_case(name, case):
    read = FR.parse(answer(case))
    expect = case["expect"]
    changes = read.changes
    assert (None if changes is None else [c.text() for c in changes]) == expect["changes"]
    assert read.drift(case["host"]) == expect["drift"]
    assert read.verdict(case["policy"], case["host"], case["stack"]) == (expect["refusal"], expect["warning"])
    assert read.degradations() == expect["degraded"]
    assert list(read.problems) == expect["problems"]
    doc = read.as_dict(case["host"])
    assert doc["drift"] == (expect["drift"] or None) and doc["changes"] == (expect["changes"] or [])
    if read.baseline is not None:
        assert doc["baseline"] == "the benchmark of 2026-12-01 (tp8)" and doc["baseline_run"] == "tp8/20261201T100000Z"
    if expect["drift"]:
        # The same words under warn: the start goes ahead and says what changed.
        refusal, warning = read.verdict("warn", case["host"], case["stack"])
        assert refusal is None and warning.startswith(f"{case['host']}'s fitness drifted since the benchmark of ")


def test_a_benchmark_run_is_marked_against_the_host_now():
    case = dict(cases("fitness-read"))["power-cap-and-link-refused"]
    read = FR.parse(answer(case))
    then = read.baseline.fitness
    assert FR.mark(then, read.now) == FB.not_comparable(read.changes)
    assert FR.mark(then, FR.parse(sections(case["baseline"]["side"]) + "@@end\n").now) is None  # the same machine
    assert FR.mark(None, read.now) is None and FR.mark(then, None) is None  # unknown: never "not comparable"


FAKE_SMI = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
printf '<?xml version="1.0" ?>\\n<nvidia_smi_log>\\n\\t<driver_version>580.95.05</driver_version>\\n'
printf '\\t<gpu id="00000000:17:00.0">\\n\\t\\t<uuid>GPU-a</uuid>\\n\\t\\t<serial>1</serial>\\n\\t</gpu>\\n</nvidia_smi_log>\\n'
"""


@pytest.mark.parametrize("mode", ["if-baseline", "always"])
def test_without_a_baseline_the_switchs_read_asks_no_gpu(tmp_path, mode):
    """The script as the host runs it: on a host never benchmarked the switch's read is the cat of
    a file that is not there; `status` (always) reads the GPUs anyway."""
    (tmp_path / "nvidia-smi").write_text(FAKE_SMI)
    (tmp_path / "nvidia-smi").chmod(0o755)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FAKE_LOG": str(log)}
    request = reads.fitness(always=mode == "always")
    assert os.path.exists(FB.BASELINE_FILE) is False  # this machine is no benchmarked host
    out = subprocess.run(request["argv"], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    read = FR.parse(out)
    assert read.baseline is None and read.changes is None and read.verdict("refuse", "h", "s") == (None, None)
    if mode == "always":
        assert log.read_text().split() == ["-q", "-x"] and [g.uuid for g in read.now.gpus] == ["GPU-a"]
        assert "<serial>" not in out  # cut on the host to what is read
    else:
        assert not log.exists() and read.now is None and out == "@@baseline\n@@end\n"
