"""Fact parsers against real captures (tests/data/nvidia/) and data cases (tests/data/facts/)."""
import dataclasses

import pytest

from components.core import facts as F

from .casedata import DATA, cases

PARSERS = {
    "query_gpu": F.parse_query_gpu, "smi_header": F.parse_smi_header, "topo": F.parse_topo,
    "nvcc": F.parse_nvcc, "systemctl_show": F.parse_systemctl_show, "os_release": F.parse_os_release,
    "facts": F.parse_facts,
}
# The command each parser reads (pinned in a case's "command", as pyinfra's fact cases do, so the
# script cannot change without its cases).
COMMANDS = {"facts": F.FACTS_SCRIPT.strip().splitlines()}


@pytest.mark.parametrize("name,case", cases("facts"), ids=lambda x: x if isinstance(x, str) else "")
def test_fact_case(name, case):
    text = (DATA / case["fixture"]).read_text() if "fixture" in case else case["output"]
    if "command" in case:
        assert case["command"] == COMMANDS[case["parser"]]
    parser = PARSERS[case["parser"]]
    args = (case["fields"],) if "fields" in case else ()
    if "error" in case:
        with pytest.raises(F.FactError, match=case["error"]):
            parser(text, *args)
        return
    got = parser(text, *args)
    if "check" in case:
        # Checked against a stack: the host's own problem, never "use world size 0".
        problems = F.check_facts(got, **case["check"])
        assert problems == case["check_problems"]
        assert not any("world size 0" in p for p in problems)
    if isinstance(got, F.HostFacts):
        got = got.as_dict()
    if isinstance(got, list):
        got = [dataclasses.asdict(g) for g in got]
    if case["parser"] == "topo":
        got = {k: got[k] for k in ("gpus", "interconnect")}
    if "expect_subset" in case:
        assert {k: got.get(k) for k in case["expect_subset"]} == case["expect_subset"]
    else:
        assert got == case["expect"]


RTX_FACTS = """@@query
0, GPU-a, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 580.95.05, 00000000:17:00.0
1, GPU-b, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 580.95.05, 00000000:2A:00.0
@@smi
| NVIDIA-SMI 580.95.05             Driver Version: 580.95.05     CUDA Version: 13.0     |
@@topo
\tGPU0\tGPU1\tCPU Affinity
GPU0\t X \tNODE\t0-31
GPU1\tNODE\t X \t0-31
@@nvcc
sh: 1: /usr/local/cuda-13.0/bin/nvcc: not found
@@rc=127
@@os
PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
@@kernel
6.18.0
@@end
"""


def test_batched_facts_parse_and_check():
    f = F.parse_facts(RTX_FACTS.replace("\\t", "\t"))
    assert len(f.gpus) == 2 and f.cuda_driver_version == "13.0" and f.interconnect == "pcie"
    assert f.toolkit_version is None and f.os.startswith("Debian")
    assert F.check_facts(f, gpu_count=2, gpu_memory_gb=96, interconnect="pcie", needed_gpus=2) == []
    problems = F.check_facts(f, gpu_count=8, gpu_memory_gb=96, interconnect="pcie", needed_gpus=8)
    assert problems and "needs 8 GPUs but the host has 2" in problems[0]
    problems = F.check_facts(f, gpu_count=2, gpu_memory_gb=141, interconnect="nvlink", needed_gpus=2)
    assert any("gpuMemoryGb says 141" in p for p in problems)
    assert any("interconnect says nvlink" in p for p in problems)


def test_nvidia_smi_failure_is_a_problem_not_a_crash():
    f = F.parse_facts("@@query\nNVIDIA-SMI has failed\n@@rc=9\n@@smi\n@@topo\n@@nvcc\n@@os\n@@kernel\n@@end\n")
    assert f.gpus == [] and f.problems == [f"nvidia-smi lists no GPUs on the host: `{' '.join(F.GPU_QUERY)}` exited 9: "
                                           "NVIDIA-SMI has failed"]
    problems = F.check_facts(f, gpu_count=8, gpu_memory_gb=141, interconnect="nvlink", needed_gpus=8)
    assert problems == f.problems  # the reason, once; no "world size 0"


def test_facts_stored_without_their_problem_still_name_no_gpus():
    f = F.HostFacts.from_dict({"gpus": [], "kernel": "6.1"})  # an older state: no problems recorded
    problems = F.check_facts(f, gpu_count=8, gpu_memory_gb=141, interconnect="nvlink", needed_gpus=8)
    assert problems == ["the strategy needs 8 GPUs but nvidia-smi lists none on the host; "
                        "check the driver with `nvidia-smi` there"]


def test_the_facts_script_ends_with_the_line_that_says_the_answer_is_whole():
    assert F.FACTS_SCRIPT.strip().splitlines()[-1] == "echo '@@end'"
    assert [line.split("'")[1][2:] for line in F.FACTS_SCRIPT.strip().splitlines()] == list(F.FACTS_SECTIONS)
