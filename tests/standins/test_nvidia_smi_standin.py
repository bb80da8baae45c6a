"""The simulated nvidia-smi answers in the real tool's formats (compared with a real H200 capture)."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.standins.helpers import CAPTURE, NVCC, NVIDIA_SMI, PROFILES, smi

ALL_PROFILES = ["h200-1", "h200-8", "rtx-pro-6000-8"]
EXPECTED = {  # profile -> (GPU count, name, MiB total)
    "h200-1": (1, "NVIDIA H200", 143771),
    "h200-8": (8, "NVIDIA H200", 143771),
    "rtx-pro-6000-8": (8, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887),
}
REQUIRED_FIELDS = ("index,name,uuid,memory.total,memory.used,memory.free,driver_version,pci.bus_id,"
                   "compute_cap,utilization.gpu,temperature.gpu,power.draw")

# Line shapes of the default table, written against the real capture.
TIMESTAMP = re.compile(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}$")
HEADER = re.compile(r"^\| NVIDIA-SMI (\S+) +Driver Version: (\S+) +CUDA Version: (\S+) +\|$")
GPU_ROW1 = re.compile(r"^\| +(\d+)  (.{27}) +(On|Off) +\| +([0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d) +(On|Off) \|"
                      r" +(\S+) \|$")
GPU_ROW2 = re.compile(r"^\| +(N/A|\d+%) +(\d+)C +(P\d+) +(\d+)W / +(\d+)W \| +(\d+)MiB / +(\d+)MiB \|"
                      r" +(\d+)% +(\S+) \|$")


def parse_table(text: str) -> list[dict]:
    """A parser of the kind components/core/facts.py needs; it must accept the capture and the stand-in."""
    lines = text.splitlines()
    assert TIMESTAMP.match(lines[0]), lines[0]
    assert all(len(line) == 91 for line in lines[1:] if line), [ln for ln in lines[1:] if ln and len(ln) != 91]
    header = HEADER.match(lines[2])
    assert header
    gpus = []
    for first, second in zip(lines, lines[1:]):
        m1, m2 = GPU_ROW1.match(first), GPU_ROW2.match(second)
        if m1:
            assert m2, second
            gpus.append({"index": int(m1[1]), "name": m1[2].strip(), "bus_id": m1[4], "used": int(m2[6]),
                         "total": int(m2[7]), "driver": header[2], "cuda": header[3]})
    return gpus


def test_default_table_is_the_capture_byte_for_byte():
    out = smi("h200-1").stdout
    real = (CAPTURE / "nvidia-smi.txt").read_text()
    assert out.splitlines()[1:] == real.splitlines()[1:]
    assert out.endswith("\n") and real.endswith("\n")
    assert parse_table(out) == parse_table(real)


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_default_table_parses_like_the_capture(profile):
    count, name, total = EXPECTED[profile]
    gpus = parse_table(smi(profile).stdout)
    assert [g["index"] for g in gpus] == list(range(count))
    assert all(g["total"] == total and g["used"] == 0 and g["cuda"] == "13.0" for g in gpus)
    assert all(name.startswith(g["name"].rstrip(".")) for g in gpus)
    if len(name) > 27:  # the real tool cuts long names: "NVIDIA RTX PRO 6000 Blac..."
        assert gpus[0]["name"] == "NVIDIA RTX PRO 6000 Blac..."


def test_query_csv_is_the_capture():
    out = smi("h200-1", "--query-gpu=index,uuid,name,memory.total,memory.used,driver_version,pci.bus_id,"
                        "compute_cap,power.limit", "--format=csv,noheader,nounits").stdout
    assert out == (CAPTURE / "query-gpu.csv").read_text()


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_query_gpu_required_fields(profile):
    count, name, total = EXPECTED[profile]
    res = smi(profile, f"--query-gpu={REQUIRED_FIELDS}", "--format=csv")
    assert res.returncode == 0
    rows = list(csv.reader(res.stdout.splitlines(), skipinitialspace=True))
    assert rows[0] == ["index", "name", "uuid", "memory.total [MiB]", "memory.used [MiB]", "memory.free [MiB]",
                       "driver_version", "pci.bus_id", "compute_cap", "utilization.gpu [%]", "temperature.gpu",
                       "power.draw [W]"]
    assert len(rows) == count + 1
    for i, row in enumerate(rows[1:]):
        assert row[0] == str(i) and row[1] == name and row[2].startswith("GPU-")
        assert row[3] == f"{total} MiB" and row[4] == "0 MiB" and row[5].endswith(" MiB")
        assert re.fullmatch(r"\d+\.\d", row[8]) and row[9].endswith(" %") and re.fullmatch(r"\d+\.\d\d W", row[11])
    bare = smi(profile, f"--query-gpu={REQUIRED_FIELDS}", "--format=csv,noheader,nounits").stdout.splitlines()
    assert len(bare) == count and bare[0].split(", ")[3] == str(total) and bare[0].split(", ")[9] == "0"


def test_query_gpu_the_engine_way_and_selection():
    out = smi("rtx-pro-6000-8", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits").stdout
    assert out.splitlines()[7] == "7, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887"
    picked = smi("h200-8", "--query-gpu=index", "--format=csv,noheader", "-i", "2,5").stdout
    assert picked == "2\n5\n"


def test_unknown_field_is_refused_like_the_real_tool():
    res = smi("h200-8", "--query-gpu=index,cuda_version", "--format=csv")
    assert res.returncode == 2
    assert res.stdout == 'Field "cuda_version" is not a valid field to query.\n\n'


def test_bad_arguments_and_missing_profile():
    res = smi("h200-8", "--no-such-option")
    assert res.returncode == 2 and "Invalid combination of input arguments" in res.stdout
    res = smi("h200-8", env={"REHEARSAL_GPU_PROFILE": "/nonexistent/profile.json"})
    assert res.returncode == 9 and "couldn't communicate with the NVIDIA driver" in res.stdout
    assert "/nonexistent/profile.json" in res.stderr


def test_xml_template_missing_is_said_not_a_traceback(tmp_path):
    # The -q -x <gpu> template is a data file beside the script: a copy of the script alone
    # answers like a host without a driver and names the file it misses.
    alone = tmp_path / "nvidia_smi.py"
    alone.write_bytes(NVIDIA_SMI.read_bytes())
    res = subprocess.run([sys.executable, str(alone), "-q", "-x"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "REHEARSAL_GPU_PROFILE": str(PROFILES / "h200-1.json")})
    assert res.returncode == 9 and "couldn't communicate with the NVIDIA driver" in res.stdout
    assert str(tmp_path / "nvidia_smi_gpu.xml.template") in res.stderr and "Traceback" not in res.stderr
    # other views do not need it
    res = subprocess.run([sys.executable, str(alone), "-L"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "REHEARSAL_GPU_PROFILE": str(PROFILES / "h200-1.json")})
    assert res.returncode == 0 and res.stdout.startswith("GPU 0: NVIDIA H200")


def test_cuda_visible_devices_is_ignored_like_the_real_tool():
    out = smi("h200-8", "-L", env={"CUDA_VISIBLE_DEVICES": "0"}).stdout
    assert len(out.splitlines()) == 8 and out.startswith("GPU 0: NVIDIA H200 (UUID: GPU-")


def test_topology_is_the_capture():
    assert smi("h200-1", "topo", "-m").stdout == (CAPTURE / "topo.txt").read_text()


def topo_matrix(text: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = text.splitlines()
    head = lines[0].replace("\x1b[4m", "").replace("\x1b[0m", "").split("\t")
    assert head[0] == "" and head[-3:] == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    cols = head[1:-3]
    rows = {}
    for line in lines[1:]:
        if not line:
            break
        cells = line.split("\t")
        # As in the real output, rows carry one empty cell more than the header (before GPU NUMA ID).
        assert len(cells) == len(head) + 1, line
        rows[cells[0]] = [c.strip() for c in cells[1:1 + len(cols)]]
    assert "Legend:" in text and "NV#  = Connection traversing a bonded set of # NVLinks" in text
    return cols, rows


def test_topology_h200_8_is_nvlink_all_to_all():
    cols, rows = topo_matrix(smi("h200-8", "topo", "-m").stdout)
    gpus = [c for c in cols if c.startswith("GPU")]
    assert len(gpus) == 8
    for i, g in enumerate(gpus):
        assert [rows[g][j] for j in range(8)] == ["X" if j == i else "NV18" for j in range(8)]
    assert "NIC Legend:" in smi("h200-8", "topo", "-m").stdout


def test_topology_rtx_is_pcie_only():
    cols, rows = topo_matrix(smi("rtx-pro-6000-8", "topo", "-m").stdout)
    links = {cell for row in rows.values() for cell in row}
    assert links <= {"X", "PIX", "PXB", "PHB", "NODE", "SYS"} and "SYS" in links and "NODE" in links
    assert not any(cell.startswith("NV") for cell in links)
    assert rows["GPU0"][:8] == ["X", "PXB", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]


def test_xml_is_the_capture():
    out = smi("h200-1", "-q", "-x").stdout
    real = (CAPTURE / "nvidia-smi-q.xml").read_text()
    def strip(s):
        return [ln for ln in s.splitlines() if "<timestamp>" not in ln]
    assert strip(out) == strip(real)


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_xml_parses_like_the_capture(profile):
    count, name, total = EXPECTED[profile]
    root = ET.fromstring(smi(profile, "-q", "-x").stdout.split("\n", 2)[2])  # past the DOCTYPE
    real = ET.fromstring((CAPTURE / "nvidia-smi-q.xml").read_text().split("\n", 2)[2])
    assert [c.tag for c in root][:4] == [c.tag for c in real][:4]
    assert root.findtext("driver_version") == "580.159.04" and root.findtext("cuda_version") == "13.0"
    assert int(root.findtext("attached_gpus")) == count == len(root.findall("gpu"))
    for gpu in root.findall("gpu"):
        assert gpu.findtext("product_name") == name
        assert gpu.findtext("fb_memory_usage/total") == f"{total} MiB"
        assert [c.tag for c in gpu] == [c.tag for c in real.find("gpu")]


def test_engine_memory_shows_in_every_view(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / f"used-{os.getpid()}.json").write_text(json.dumps(
        {"pid": os.getpid(), "process_name": "/root/venv/bin/python3", "gpus": {"0": 80000, "1": 80000}}))
    (state / "used-999999999.json").write_text(json.dumps({"pid": 999999999, "gpus": {"2": 5000}}))  # dead
    env = {"REHEARSAL_GPU_STATE_DIR": str(state)}
    used = smi("h200-8", "--query-gpu=memory.used", "--format=csv,noheader,nounits", env=env).stdout.split()
    assert used == ["80000", "80000", "0", "0", "0", "0", "0", "0"]
    table = smi("h200-8", env=env).stdout
    assert [g["used"] for g in parse_table(table)][:3] == [80000, 80000, 0]
    assert re.search(r"^\|    0   N/A  N/A +%d +C   /root/venv/bin/python3 +80000MiB \|$" % os.getpid(), table, re.M)
    apps = smi("h200-8", "--query-compute-apps=pid,used_memory", "--format=csv", env=env).stdout
    assert apps.splitlines() == ["pid, used_gpu_memory [MiB]", f"{os.getpid()}, 80000 MiB", f"{os.getpid()}, 80000 MiB"]
    root = ET.fromstring(smi("h200-8", "-q", "-x", env=env).stdout.split("\n", 2)[2])
    assert root.find("gpu").findtext("processes/process_info/used_memory") == "80000 MiB"


def test_nvcc_version_is_the_capture(tmp_path):
    real = (CAPTURE / "cuda.txt").read_text().splitlines()[:5]
    out = subprocess.run([sys.executable, str(NVCC), "--version"], capture_output=True, text=True).stdout
    assert out.splitlines() == real
    # Installed in a toolkit tree, it answers with that toolkit's version.json.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text(NVCC.read_text())
    (tmp_path / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": "12.8.93"}}))
    out = subprocess.run([sys.executable, str(tmp_path / "bin" / "nvcc"), "--version"], capture_output=True,
                         text=True, env={k: v for k, v in os.environ.items() if k != "REHEARSAL_NVCC_VERSION"}).stdout
    assert "Cuda compilation tools, release 12.8, V12.8.93" in out


def test_profiles_are_well_formed():
    for profile in ALL_PROFILES:
        data = json.loads((PROFILES / f"{profile}.json").read_text())
        assert {"driver_version", "cuda_version", "gpus"} <= set(data)
        uuids = [g["uuid"] for g in data["gpus"]]
        assert len(set(uuids)) == len(uuids)
