"""Fact parsers against real captures (tests/data/nvidia/) and data cases (tests/data/facts/)."""
import dataclasses
import json
import re

import pytest

from components.core import facts as F
from components.core import fitness as FITNESS
from components.core import fitness_baseline as FB

from .casedata import DATA, cases

PARSERS = {
    "query_gpu": F.parse_query_gpu, "smi_header": F.parse_smi_header, "topo": F.parse_topo,
    "nvcc": F.parse_nvcc, "systemctl_show": F.parse_systemctl_show, "os_release": F.parse_os_release,
    "facts": F.parse_facts,
    "fitness_xml": lambda text: fitness_reading(FITNESS.parse_fitness(text)),
    "nccl": FITNESS.parse_nccl, "iommu": FITNESS.parse_iommu,
}


def fitness_reading(f: FITNESS.HostFitness) -> dict:
    """A fitness reading as a case states it: the versions, each GPU, what is degraded now."""
    return {"driver_version": f.driver_version, "cuda_version": f.cuda_version, "problems": list(f.problems),
            "gpus": [dataclasses.asdict(g) | {"clock_limits": list(g.clock_limits)} for g in f.gpus],
            "degradations": FITNESS.degradations(f)}


def edited(text: str, edits: list) -> str:
    """A real capture with a case's edits: [old, new, which occurrence (0: the first)], each
    of which must be there (a case degrades one GPU of a real report, in the tool's own shape)."""
    for old, new, which in edits:
        at = -1
        for _ in range(which + 1):
            at = text.find(old, at + 1)
            assert at >= 0, f"the capture has no occurrence {which} of {old!r}"
        text = text[:at] + new + text[at + len(old):]
    return text
# The command each parser reads (pinned in a case's "command", as pyinfra's fact cases do, so the
# script cannot change without its cases).
COMMANDS = {"facts": F.FACTS_SCRIPT.strip().splitlines()}


@pytest.mark.parametrize("name,case", cases("facts"), ids=lambda x: x if isinstance(x, str) else "")
def test_fact_case(name, case):
    text = (DATA / case["fixture"]).read_text() if "fixture" in case else case["output"]
    text = edited(text, case.get("edit", []))
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
    if isinstance(got, (tuple, dict)):
        got = json.loads(json.dumps(got))  # as a case states it (tuples are lists)
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
@@fitness
<?xml version="1.0" ?>
<nvidia_smi_log>
\t<driver_version>580.95.05</driver_version>
\t<cuda_version>13.0</cuda_version>
\t<gpu id="00000000:17:00.0">
\t\t<product_name>NVIDIA RTX PRO 6000 Blackwell Server Edition</product_name>
\t\t<uuid>GPU-a</uuid>
\t\t<persistence_mode>Disabled</persistence_mode>
\t</gpu>
</nvidia_smi_log>
@@iommu
groups 12
cmdline BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt
@@nccl
system /usr/lib/x86_64-linux-gnu/libnccl.so.2.27.7
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
    assert f.fitness.gpus[0].persistence_mode == "Disabled" and f.fitness.nccl_version == "2.27.7"
    assert f.fitness.iommu is True and f.fitness.iommu_cmdline == ("intel_iommu=on", "iommu=pt")
    assert F.HostFacts.from_dict(f.as_dict()) == f  # through Pulumi's state and back
    assert F.check_facts(f, gpu_count=2, gpu_memory_gb=96, interconnect="pcie", needed_gpus=2) == []
    problems = F.check_facts(f, gpu_count=8, gpu_memory_gb=96, interconnect="pcie", needed_gpus=8)
    assert problems and "needs 8 GPUs but the host has 2" in problems[0]
    problems = F.check_facts(f, gpu_count=2, gpu_memory_gb=141, interconnect="nvlink", needed_gpus=2)
    assert any("gpuMemoryGb says 141" in p for p in problems)
    assert any("interconnect says nvlink" in p for p in problems)


def test_nvidia_smi_failure_is_a_problem_not_a_crash():
    f = F.parse_facts("@@query\nNVIDIA-SMI has failed\n@@rc=9\n@@smi\n@@topo\n@@nvcc\n@@fitness\nNVIDIA-SMI has failed\n@@rc=9\n"
                      "@@iommu\n@@nccl\n@@os\n@@kernel\n@@end\n")
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
    assert re.findall(r"echo '@@(\w+)'", F.FACTS_SCRIPT) == list(F.FACTS_SECTIONS)


# The answer the facts script gives when its commands run one after the other: what every
# recorded case above holds, and what the concurrent script must print, byte for byte.
IN_TURN = r"""
echo '@@query'; nvidia-smi {query} 2>&1 || echo "@@rc=$?"
echo '@@smi'; nvidia-smi 2>&1 | head -n 6
echo '@@topo'; nvidia-smi topo -m 2>&1
echo '@@nvcc'; "$1/bin/nvcc" --version 2>&1 || echo "@@rc=$?"
echo '@@fitness'; { nvidia-smi -q -x 2>&1 || echo "@@rc=$?"; } | {xml_filter}
echo '@@iommu'; {iommu}
echo '@@nccl'; {nccl}
echo '@@baseline'; cat {baseline} 2>/dev/null
echo '@@os'; cat /etc/os-release
echo '@@kernel'; uname -r
echo '@@end'
""".replace("{query}", " ".join(F.GPU_QUERY[1:])).replace("{xml_filter}", FITNESS.XML_FILTER) \
    .replace("{iommu}", FITNESS.IOMMU_SCRIPT).replace("{nccl}", FITNESS.NCCL_SCRIPT).replace("{baseline}", FB.BASELINE_FILE)

# A stand-in nvidia-smi / nvcc whose slowest answer is the first section's, each logging when it
# ran: printed in turn, the sections would come back in the wrong order if nothing sorted them.
FAKE_SMI = r"""#!/bin/sh
echo "start $(date +%s.%N) $*" >> "$FAKE_LOG"
case "$1" in
  --query-gpu=*) sleep 0.4; [ -n "$SMI_FAIL" ] && { echo "NVIDIA-SMI has failed"; exit 9; }
                 i=0; while [ $i -lt 8 ]; do echo "$i, GPU-$i, NVIDIA H200, 143771, 570.86.15, 00000000:0$i:00.0"; i=$((i+1)); done ;;
  topo) sleep 0.1; printf '\033[4mGPU0\tGPU1\033[0m\nGPU0\t X \tNV18\n\nLegend:\n  X    = Self\n' ;;
  "") sleep 0.2; i=0; while [ $i -lt 40 ]; do echo "header line $i with some width to it ....................."; i=$((i+1)); done ;;
  -q) sleep 0.15; [ -n "$SMI_FAIL" ] && { echo "NVIDIA-SMI has failed"; exit 9; }
      printf '<?xml version="1.0" ?>\n<nvidia_smi_log>\n\t<driver_version>570.86.15</driver_version>\n'
      i=0; while [ $i -lt 8 ]; do
        printf '\t<gpu id="00000000:0%d:00.0">\n\t\t<uuid>GPU-%d</uuid>\n\t\t<serial>%d</serial>\n\t</gpu>\n' $i $i $i
        i=$((i+1)); done
      echo '</nvidia_smi_log>' ;;
esac
echo "end $(date +%s.%N) $*" >> "$FAKE_LOG"
"""
FAKE_NVCC = r"""#!/bin/sh
echo "start $(date +%s.%N) nvcc" >> "$FAKE_LOG"
sleep 0.3
printf 'nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.48\n'
echo "end $(date +%s.%N) nvcc" >> "$FAKE_LOG"
"""


@pytest.mark.parametrize("variant", ["all answer", "nvidia-smi fails", "no nvcc"])
def test_the_facts_commands_run_at_once_and_answer_as_if_in_turn(tmp_path, variant):
    import os
    import subprocess

    bin_dir, cuda = tmp_path / "bin", tmp_path / "cuda"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    if variant != "no nvcc":
        (cuda / "bin").mkdir(parents=True)
        (cuda / "bin" / "nvcc").write_text(FAKE_NVCC)
        (cuda / "bin" / "nvcc").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "log"),
           **({"SMI_FAIL": "1"} if variant == "nvidia-smi fails" else {})}

    def answer(script):
        out = subprocess.run(["sh", "-c", script, "sh", str(cuda)], env=env, capture_output=True, timeout=60)
        assert out.returncode == 0 and out.stderr == b"", out
        return out.stdout

    concurrent = answer(F.FACTS_SCRIPT)
    log = (tmp_path / "log").read_text().split("\n")
    (tmp_path / "log").unlink()
    # The same bytes, but for the line of the script a shell names in its own error ("sh: 6:
    # .../nvcc: not found"), which no parser reads.
    def same(text):
        return re.sub(rb"^sh: \d+: ", b"sh: N: ", text, flags=re.M)

    assert same(concurrent) == same(answer(IN_TURN))
    facts = F.parse_facts(concurrent.decode())
    assert len(facts.gpus) == (0 if variant == "nvidia-smi fails" else 8)
    assert facts.toolkit_version == (None if variant == "no nvcc" else "13.0")
    if variant != "nvidia-smi fails":  # the report cut to what fitness reads: not the serial
        assert [g.uuid for g in facts.fitness.gpus] == [f"GPU-{i}" for i in range(8)] and b"<serial>" not in concurrent
    # At once: every command had started before the first one ended.
    events = [line.split(" ", 2) for line in log if line]
    first_end = min(float(t) for kind, t, _ in events if kind == "end")
    starts = [float(t) for kind, t, _ in events if kind == "start"]
    assert len(starts) == (4 if variant == "no nvcc" else 5) and max(starts) < first_end, log


# ---------------------------------------------------------------------------------------------
# One list of `systemctl show` properties (facts.UNIT_PROPERTIES): every script that reads a unit
# asks for it, and every name a parser reads from an answer is in it.

# Keys the parsers read that are not systemd properties: SERVING_SCRIPT's own lines (Stack=,
# Cmdline=, Environ=), /etc/os-release's ID, and a journal entry's MESSAGE (`journalctl -o json`,
# read by core/start_phases.py).
NOT_PROPERTIES = {"Stack", "RoutedBy", "Cmdline", "Environ", "ID", "MESSAGE"}


def test_every_unit_read_asks_for_the_one_list():
    from components.core import facts, reads, status, switch
    from components.remote import probe
    scripts = {"POLL_SCRIPT": reads.POLL_SCRIPT, "SNAPSHOT_SCRIPT": reads.SNAPSHOT_SCRIPT,
               "SERVICE_SCRIPT": reads.SERVICE_SCRIPT, "SERVING_SCRIPT": status.SERVING_SCRIPT,
               "MANAGED_UNITS_SCRIPT": switch.MANAGED_UNITS_SCRIPT, "START_SCRIPT": probe.START_SCRIPT}
    for name, script in scripts.items():
        lines = [line for line in script.splitlines() if "systemctl show -p" in line]
        # SNAPSHOT_SCRIPT's wait loop asks one value (--value) every 0.2 s: one of the list.
        single = [re.search(r"-p (\w+) --value", line) for line in lines if "--value" in line]
        assert all(m and m.group(1) in facts.UNIT_PROPERTIES for m in single), name
        asks = [line for line in lines if "--value" not in line]
        # The unit's environment (dropins.py) is the one other list, asked on its own line.
        assert asks and all(facts.SHOW_OPTIONS + " --" in line or facts.ENVIRONMENT_SHOW_OPTIONS + " --" in line
                            for line in asks), name
        assert any(facts.SHOW_OPTIONS + " --" in line for line in asks), name
    assert reads.unit_states(["u.service"])["argv"] == ["systemctl", "show", *facts.show_options(), "--", "u.service"]


def test_every_property_a_parser_reads_is_asked_for():
    import ast
    from pathlib import Path

    from components.core import facts
    read: dict[str, set[str]] = {}
    root = Path(facts.__file__).resolve().parent.parent
    for path in [*root.glob("core/*.py"), *root.glob("remote/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            # props.get("ActiveState"), num("NRestarts"): a name read from a `systemctl show` answer
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and re.fullmatch(r"[A-Z][A-Za-z]+", node.args[0].value) \
                    and (getattr(node.func, "attr", None) == "get" or getattr(node.func, "id", None) == "num"):
                read.setdefault(node.args[0].value, set()).add(path.name)
            # sed -n 's/^MainPID=//p' in a script
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in re.findall(r"s/\^([A-Z][A-Za-z]+)=", node.value):
                    read.setdefault(name, set()).add(path.name)
    assert {"ActiveState", "NRestarts", "ExecMainStatus", "ActiveEnterTimestampMonotonic"} <= set(read)
    unasked = {name: files for name, files in read.items() if name not in facts.UNIT_PROPERTIES and name not in NOT_PROPERTIES}
    assert not unasked, f"read but never asked for (add to facts.UNIT_PROPERTIES): {unasked}"


@pytest.mark.parametrize("capture", ["h200-1gpu", "h200-2gpu-nvlink"])
def test_the_report_cut_on_the_host_reads_as_the_whole_report(capture):
    """XML_FILTER (run on the host, in FACTS_SCRIPT) keeps every element the parser reads."""
    import subprocess
    whole = (DATA / "nvidia" / capture / "nvidia-smi-q.xml").read_text()
    cut = subprocess.run(["sh", "-c", FITNESS.XML_FILTER], input=whole, capture_output=True, text=True, timeout=30)
    assert cut.returncode == 0 and cut.stderr == ""
    assert FITNESS.parse_smi_xml(cut.stdout) == FITNESS.parse_smi_xml(whole)
    assert len(cut.stdout) < len(whole) / 4 and "<supported_graphics_clock>" not in cut.stdout
