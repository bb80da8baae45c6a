"""The drift check's fitness drift (components/remote/providers.py HostFactsProvider): the host
facts answer carries the host's benchmark baseline (core/facts.py `@@baseline`); a fitness that
differs from it is the output `fitnessDrift` (its own kind, named from what to what on which GPU),
a change in the preview that `up` records and cannot repair; no baseline, or the same machine, is
no change. The host's answer is the real H200 report with a case's edits."""
from __future__ import annotations

import pytest

from components.core import fitness_baseline as FB
from components.remote import channels, providers, ssh

from ..casedata import DATA
from ..core.test_fitness_read import sections

REPORT = {"fixture": "nvidia/h200-2gpu-nvlink/nvidia-smi-q.xml", "nccl": "", "iommu": "groups 0\ncmdline ro\n"}
CAPPED = {**REPORT, "edit": [["<current_power_limit>700.00 W</current_power_limit>",
                              "<current_power_limit>450.00 W</current_power_limit>", 1]]}
CONNECTION = {"host": "10.213.0.2", "port": 22, "user": "root", "privateKey": "k", "hostKey": "h", "rehearsal": "gpu1"}
PROPS = {"connection": CONNECTION, "cudaHome": "/usr/local/cuda-13.0",
         "expect": {"gpuCount": 2, "gpuMemoryGb": 141, "interconnect": "nvlink", "neededGpus": 2}, "prefetch": None}


def facts_answer(now: dict, baseline: dict | None) -> str:
    """FACTS_SCRIPT's answer on the 2-GPU H200 capture: the GPUs (`now`'s report) and the
    baseline a benchmark left (`baseline`'s report), or none."""
    query = (DATA / "nvidia/h200-2gpu-nvlink/query-gpu.csv").read_text().splitlines()
    rows = [f"{c[0]}, {c[2]}, {c[1]}, {c[4]}, {c[6]}, {c[3]}" for c in (line.split(", ") for line in query)]
    doc = ""
    if baseline is not None:
        from components.core import fitness_read
        then = fitness_read.parse(sections(baseline) + "@@end\n").now.as_dict()
        doc = FB.baseline_document(stack="tp8", run="tp8/20261201T100000Z", date="2026-12-01T10:00:00+00:00",
                                   host="rehearsal:gpu1", fitness=then)
    topo = (DATA / "nvidia/h200-2gpu-nvlink/topo.txt").read_text()
    fitness = sections(now)  # @@fitness, @@iommu, @@nccl as the script prints them
    return ("@@query\n" + "\n".join(rows) + "\n@@smi\n| Driver Version: 580.159.04     CUDA Version: 13.0 |\n@@topo\n"
            + topo + "@@nvcc\nCuda compilation tools, release 13.0, V13.0.88\n" + fitness
            + "@@baseline\n" + doc + "@@os\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n@@kernel\n6.1.0\n@@end\n")


@pytest.fixture
def host(monkeypatch):
    answers = {}

    def fetch_first(t, request):
        return channels.Result(0, answers["facts"], "")
    monkeypatch.setattr(ssh, "fetch_first", fetch_first)
    return answers


def test_a_power_cap_since_the_benchmark_is_fitness_drift_and_no_repair(host, capsys):
    host["facts"] = facts_answer(CAPPED, REPORT)
    provider = providers.HostFactsProvider()
    outs = provider.read("id", {**PROPS, "facts": None}).outs
    drift = outs["fitnessDrift"]
    assert FB.is_fitness_drift(drift)
    assert drift == ("fitness drift: gpu1 since the benchmark of 2026-12-01 (tp8): GPU 1 (00000000:00:07.0): power limit "
                     "700 W -> 450 W. Not repairable by `pulumi up` (the machine changed, not a file): GPU 1 "
                     "(00000000:00:07.0): nvidia-smi -i 1 -pl 700; or benchmark again (`python -m components bench`) "
                     "to make this the baseline.")
    assert outs["facts"]["gpu_count"] == 2
    # The preview: a change of the host facts (so --expect-no-changes fails), its line said.
    assert provider.diff("id", outs, PROPS).changes is True
    assert f"warning: {drift}" in capsys.readouterr().err
    # `up` records it again (no error, nothing to repair): the next drift check still reports it.
    assert provider.update("id", outs, PROPS).outs["fitnessDrift"] == drift


def test_the_same_machine_or_no_baseline_is_no_change(host):
    provider = providers.HostFactsProvider()
    for answer in (facts_answer(REPORT, REPORT), facts_answer(CAPPED, None)):
        host["facts"] = answer
        # A drift recorded before is this read's to say again or not: restored since, it is gone.
        outs = provider.read("id", {**PROPS, "facts": None, "fitnessDrift": "fitness drift: gpu1 since ..."}).outs
        assert "fitnessDrift" not in outs
        assert provider.diff("id", outs, PROPS).changes is False
        assert "fitnessDrift" not in provider.create(PROPS).outs
