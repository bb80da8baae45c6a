"""The rehearsal nvidia-smi's fitness answers (rehearsal/gpu/nvidia_smi_fitness.py): each
degradation shows in the XML report, the CSV query and the table as the real tool shows it, and
the facts script reads it through the same parser as a real host (components/core/fitness.py)."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess

import pytest

from components.core import facts as F
from components.core import fitness as FIT
from tests.standins.helpers import NVIDIA_SMI, PROFILES, smi

DEGRADED = {"schema": 1, "gpus": {
    "1": {"power_cap_w": 450},
    "2": {"clocks_locked_mhz": 1200},
    "3": {"pcie": "gen4x8"},
    "4": {"ecc_retired_pages": 3},
    "5": {"persistence_off": True},
}}
# What core/fitness.py says of each degraded GPU of the h200-8 profile.
EXPECTED = {
    1: ["power capped at 450 W (default 700 W)"],
    2: ["applications clocks at 1200 MHz (default 1980 MHz)",
        "clocks held by an applications-clocks or locked-clocks setting"],
    3: ["PCIe link x8 of x16", "PCIe link Gen4 of Gen5"],
    4: ["retired memory pending a reboot (ECC errors)"],
    5: ["persistence mode off (the driver unloads between uses: every start pays its load)"],
}


def degraded_env(tmp_path, doc=DEGRADED) -> dict:
    path = tmp_path / "gpu-degrade.json"
    path.write_text(json.dumps(doc))
    return {"REHEARSAL_GPU_DEGRADE": str(path)}


def test_an_undegraded_profile_reads_as_fit(tmp_path):
    xml = smi("h200-8", "-q", "-x", env=degraded_env(tmp_path, {"schema": 1, "gpus": {}})).stdout
    _, _, gpus = FIT.parse_smi_xml(xml)
    assert len(gpus) == 8 and all(FIT.gpu_degradations(g) == [] for g in gpus)
    assert gpus[0].power_limit_w == gpus[0].power_default_limit_w == 700.0
    assert (gpus[0].pcie_gen_current, gpus[0].pcie_width_current) == (5, 16)


def test_each_degradation_shows_in_the_xml_report(tmp_path):
    _, _, gpus = FIT.parse_smi_xml(smi("h200-8", "-q", "-x", env=degraded_env(tmp_path)).stdout)
    assert {g.index: FIT.gpu_degradations(g) for g in gpus if FIT.gpu_degradations(g)} == EXPECTED
    assert gpus[4].remapped_rows_uncorrectable == 3 and gpus[4].remapped_rows_pending is True
    assert gpus[4].retired_pages_dbe is None  # Hopper remaps rows; page retirement is N/A, as captured


def test_the_csv_query_and_the_table_agree_with_the_report(tmp_path):
    env = degraded_env(tmp_path)
    fields = ("index,power.limit,power.default_limit,clocks.applications.graphics,clocks.default_applications.gr,"
              "pcie.link.gen.current,pcie.link.width.current,persistence_mode,clocks_event_reasons.applications_clocks_setting,"
              "clocks_throttle_reasons.sw_power_cap,retired_pages.sbe")
    out = smi("h200-8", f"--query-gpu={fields}", "--format=csv,noheader,nounits", env=env)
    assert out.returncode == 0, out
    rows = {int(r[0]): [c.strip() for c in r[1:]] for r in csv.reader(out.stdout.splitlines())}
    assert rows[1][:2] == ["450.00", "700.00"]
    assert rows[2][2:4] == ["1200", "1980"] and rows[2][7] == "Active"
    assert rows[3][4:6] == ["4", "8"] and rows[5][6] == "Disabled"
    assert rows[0][7:] == ["Not Active", "Not Active", "[N/A]"]
    header = smi("h200-8", "--query-gpu=power.default_limit,clocks.applications.gr", "--format=csv", env=env).stdout
    assert header.splitlines()[0] == "power.default_limit [W], clocks.applications.graphics [MHz]"
    table = smi("h200-8", env=env).stdout
    assert table.count("/  450W |") == 1 and table.count("/  700W |") == 7  # Pwr:Usage/Cap shows the cap
    assert re.findall(r"NVIDIA H200 +(On|Off) +\|", table) == ["On"] * 5 + ["Off"] + ["On"] * 2  # Persistence-M


@pytest.mark.parametrize("doc,said", [
    ({"schema": 1, "gpus": {"1": {"power_cap_w": 900}}}, "power_cap_w 900 is outside the GPU's range 200-700 W"),
    ({"schema": 1, "gpus": {"1": {"pcie": "gen6x16"}}}, "above the GPU's Gen5 x16"),
    ({"schema": 1, "gpus": {"1": {"pcie": "x8"}}}, "not a link like 'gen4x8'"),
    ({"schema": 1, "gpus": {"9": {"persistence_off": True}}}, "GPU 9 is not in the profile"),
    ({"schema": 1, "gpus": {"all": {"fan_broken": True}}}, "unknown degradation(s) fan_broken; known: power_cap_w"),
    ({"gpus": {}}, "expected {\"schema\": 1"),
])
def test_a_degradation_the_hardware_cannot_have_is_refused_by_name(tmp_path, doc, said):
    res = smi("h200-8", "-L", env=degraded_env(tmp_path, doc))
    assert res.returncode == 9 and "couldn't communicate with the NVIDIA driver" in res.stdout
    assert said in res.stderr and str(tmp_path / "gpu-degrade.json") in res.stderr


def facts_through_the_stand_in(tmp_path, profile: str, env: dict) -> F.HostFacts:
    """FACTS_SCRIPT as a host runs it, with the stand-in as its nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "nvidia-smi"
    wrapper.write_text(f"#!/bin/sh\nexec python3 {NVIDIA_SMI} \"$@\"\n")
    wrapper.chmod(0o755)
    run_env = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}",
               "REHEARSAL_GPU_PROFILE": str(PROFILES / f"{profile}.json"), "REHEARSAL_GPU_STATE_DIR": str(tmp_path / "state")}
    out = subprocess.run(["sh", "-c", F.FACTS_SCRIPT, "sh", str(tmp_path / "no-cuda")], env=run_env, capture_output=True,
                         text=True, timeout=120)
    return F.parse_facts(out.stdout)


def test_the_facts_script_reads_the_degraded_host(tmp_path):
    facts = facts_through_the_stand_in(tmp_path, "rtx-pro-6000-8", degraded_env(tmp_path))
    f = facts.fitness
    assert len(facts.gpus) == len(f.gpus) == 8 and f.problems == ()
    assert f.driver_version == facts.driver_version and f.cuda_version == facts.cuda_driver_version
    lines = FIT.degradations(f)
    assert "GPU 1 (00000000:27:00.0): power capped at 450 W (default 600 W)" in lines
    assert "GPU 3 (00000000:4A:00.0): PCIe link x8 of x16" in lines
    assert [g.index for g in f.gpus if FIT.gpu_degradations(g)] == [1, 2, 3, 4, 5]
