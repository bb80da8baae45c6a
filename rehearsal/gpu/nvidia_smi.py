#!/usr/bin/env python3
"""Rehearsal stand-in for ``nvidia-smi``: answers from a hardware profile, in the real formats.

Installed on a rehearsal host as /usr/bin/nvidia-smi. There is no GPU and no driver behind it:
every answer comes from a JSON hardware profile (``$REHEARSAL_GPU_PROFILE``, default
/etc/rehearsal/gpu-profile.json; schema in rehearsal/gpu/README.md). Output shapes were taken
from real captures of driver 580 (tests/data/nvidia/h200-1gpu/), so parsers written against this
tool parse the real one.

What it answers (everything else gets the real tool's "Invalid combination" error, exit 2):
  nvidia-smi                                   the default table
  nvidia-smi -L                                one line a GPU
  nvidia-smi --version                         versions block
  nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits] [-i IDS]
  nvidia-smi --query-compute-apps=F,... --format=csv[,noheader][,nounits]
  nvidia-smi --help-query-gpu                  the field names this stand-in knows
  nvidia-smi topo -m                           the topology matrix
  nvidia-smi -q -x                             the XML report

Like the real tool it ignores CUDA_VISIBLE_DEVICES and always lists every GPU.
Memory used by a running rehearsal engine is read from ``$REHEARSAL_GPU_STATE_DIR`` (default
/run/rehearsal-gpu): each engine writes ``used-<pid>.json``; files of dead processes are ignored.
Stdlib only: it runs with the host's python3 and nothing else. `-q -x` fills the <gpu> template
in nvidia_smi_gpu.xml.template, which must sit beside this file.
"""
from __future__ import annotations

import json
import os
import sys
import time

try:  # beside this file (power, clocks, ECC, PCIe; degradations)
    import nvidia_smi_fitness as fitness
except ImportError:  # a copy of this file alone: the views that need it say so (render_xml)
    fitness = None

DEFAULT_PROFILE = "/etc/rehearsal/gpu-profile.json"
DEFAULT_STATE_DIR = "/run/rehearsal-gpu"

# The real tool's messages and exit codes.
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
EXIT_NO_DRIVER = 9
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
EXIT_BAD_ARGS = 2
EXIT_BAD_FIELD = 2

# Values every GPU gets unless its profile entry says otherwise (an idle H200, as captured).
GPU_DEFAULTS = {
    "product_brand": "NVIDIA",
    "architecture": "Hopper",
    "compute_cap": "9.0",
    "persistence_mode": "Enabled",
    "display_active": "Disabled",
    "display_attached": "No",
    "fan_speed": "N/A",
    "temperature_c": 39,
    "memory_temperature_c": 41,
    "perf_state": "P0",
    "power_draw_w": 125.49,
    "power_draw_average_w": 125.92,
    "power_limit_w": 700.0,
    "power_min_limit_w": 200.0,
    "power_max_limit_w": 700.0,
    "utilization_gpu": 0,
    "utilization_memory": 0,
    "compute_mode": "Default",
    "ecc_mode": "Enabled",
    "volatile_uncorrected_ecc": "0",
    "mig_mode": "Disabled",
    "memory_reserved_mib": 0,
    "memory_used_mib": 0,
    "memory_free_bias_mib": 0,
    "bar1_total_mib": 262144,
    "bar1_used_mib": 1,
    "pcie_gen_max": 5,
    "pcie_gen_current": 5,
    "pcie_width_max": 16,
    "pcie_width_current": 16,
    "pci_device_id": "233510DE",
    "pci_sub_system_id": "18BF10DE",
    "clocks_graphics_mhz": 1980,
    "clocks_sm_mhz": 1980,
    "clocks_mem_mhz": 3201,
    "clocks_video_mhz": 1545,
    "clocks_max_graphics_mhz": 1980,
    "clocks_max_sm_mhz": 1980,
    "clocks_max_mem_mhz": 3201,
    "clocks_max_video_mhz": 1545,
    "supported_mem_clocks_mhz": [3201, 2201],
    "supported_graphics_clock_min_mhz": 345,
    "supported_graphics_clock_step_mhz": 15,
    "vbios_version": "96.00.A5.00.1A",
    "board_part_number": "692-2G520-0282-001",
    "gpu_part_number": "2335-895-A1",
    "inforom_img_version": "G520.0282.02.02",
    "virtualization_mode": "None",
    "gsp_firmware_version": None,  # defaults to the driver version
    "pdi": "N/A",
    "pcie_tx_util": "0 KB/s",
    "pcie_rx_util": "0 KB/s",
    "memory_power_draw_w": None,
}


class ProfileError(Exception):
    pass


class StandInError(Exception):
    """A file of the stand-in itself is missing: answered like a host without a driver."""


# --------------------------------------------------------------------------- profile

def load_profile(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            profile = json.load(f)
    except FileNotFoundError:
        raise ProfileError(f"rehearsal nvidia-smi: no hardware profile at {path} (set REHEARSAL_GPU_PROFILE)")
    except (OSError, ValueError) as exc:
        raise ProfileError(f"rehearsal nvidia-smi: cannot read hardware profile {path}: {exc}")
    for key in ("driver_version", "cuda_version", "gpus"):
        if key not in profile:
            raise ProfileError(f"rehearsal nvidia-smi: profile {path} lacks '{key}'")
    defaults = {**GPU_DEFAULTS, **(fitness.FITNESS_DEFAULTS if fitness else {}), **profile.get("gpu_defaults", {})}
    gpus = []
    for position, entry in enumerate(profile["gpus"]):
        gpu = {**defaults, **entry}
        gpu.setdefault("index", position)
        gpu.setdefault("minor_number", gpu["index"])
        for key in ("name", "uuid", "pci_bus_id", "memory_total_mib"):
            if key not in gpu:
                raise ProfileError(f"rehearsal nvidia-smi: GPU {position} of {path} lacks '{key}'")
        if gpu["gsp_firmware_version"] is None:
            gpu["gsp_firmware_version"] = profile["driver_version"]
        gpus.append(fitness.derive(gpu) if fitness else gpu)
    profile["gpus"] = gpus
    if fitness:
        try:
            profile["gpus"] = fitness.apply_degradations(gpus, fitness.degrade_path())
        except fitness.DegradeError as exc:
            raise ProfileError(f"rehearsal nvidia-smi: {exc}")
    return profile


def engine_usage(state_dir: str) -> tuple[dict[int, int], list[dict]]:
    """MiB used per GPU index by live rehearsal engines, and their process rows.

    Each engine writes ``used-<pid>.json``: {"pid": N, "process_name": "...", "gpus": {"0": MiB}}.
    A file whose process is gone is stale (a crashed engine frees its memory) and is ignored.
    """
    used: dict[int, int] = {}
    processes: list[dict] = []
    try:
        names = sorted(os.listdir(state_dir))
    except OSError:
        return used, processes
    for name in names:
        if not (name.startswith("used-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(state_dir, name), encoding="utf-8") as f:
                record = json.load(f)
            pid = int(record["pid"])
            gpus = {int(k): int(v) for k, v in record["gpus"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(pid):
            continue
        for index, mib in sorted(gpus.items()):
            used[index] = used.get(index, 0) + mib
            processes.append({"gpu": index, "pid": pid, "type": "C",
                              "name": str(record.get("process_name", "python3")), "mib": mib})
    processes.sort(key=lambda p: (p["gpu"], p["pid"]))
    return used, processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def memory(gpu: dict, extra_used: int) -> tuple[int, int, int, int]:
    """(total, reserved, used, free) in MiB, as the driver reports them."""
    total = int(gpu["memory_total_mib"])
    reserved = int(gpu["memory_reserved_mib"])
    used = min(int(gpu["memory_used_mib"]) + extra_used, total - reserved)
    # Drivers round total, reserved and free separately; the H200 capture's free is one MiB
    # more than total - reserved - used. A profile states that offset to match its capture.
    free = max(total - reserved - used + int(gpu["memory_free_bias_mib"]), 0)
    return total, reserved, used, free


# --------------------------------------------------------------------------- default table

def _truncate_name(name: str) -> str:
    # The table's name column holds 27 characters; longer names lose their tail.
    return name if len(name) <= 27 else name[:24] + "..."


def _truncate_process(name: str) -> str:
    return name if len(name) <= 32 else "..." + name[-29:]


def _on_off(value: str) -> str:
    return {"Enabled": "On", "Disabled": "Off"}.get(value, value)


def render_table(profile: dict, used: dict[int, int], processes: list[dict], now: float) -> str:
    wide = "+" + "-" * 89 + "+"
    cols = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    lines = [time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(now)) + " " * 7, wide]
    lines.append("| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|" % (
        profile["driver_version"], profile["driver_version"], profile["cuda_version"]))
    lines += [
        cols,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for gpu in profile["gpus"]:
        total, _reserved, mem_used, _free = memory(gpu, used.get(gpu["index"], 0))
        fan = gpu["fan_speed"] if gpu["fan_speed"] == "N/A" else "%d%%" % int(gpu["fan_speed"])
        lines.append("|%4d  %-31s%-3s |%19s %3s |%21s |" % (
            gpu["index"], _truncate_name(gpu["name"]), _on_off(gpu["persistence_mode"]),
            gpu["pci_bus_id"], _on_off(gpu["display_active"]), gpu["volatile_uncorrected_ecc"]))
        lines.append("| %3s  %3dC    %-2s%16s / %5s |%8dMiB / %6dMiB |%7d%%%13s |" % (
            fan, int(gpu["temperature_c"]), gpu["perf_state"],
            "%dW" % round(float(gpu["power_draw_w"])), "%dW" % round(float(gpu["power_limit_w"])),
            mem_used, total, int(gpu["utilization_gpu"]), gpu["compute_mode"]))
        lines.append("|%41s|%24s|%21s |" % ("", "", gpu["mig_mode"]))
        lines.append(cols)
    lines += [
        "",
        wide,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
    ]
    if not processes:
        lines.append("|  No running processes found".ljust(90) + "|")
    for proc in processes:
        lines.append("|%5d   N/A  N/A%16d%7s   %-38s%8s |" % (
            proc["gpu"], proc["pid"], proc["type"], _truncate_process(proc["name"]),
            "%dMiB" % proc["mib"]))
    lines.append(wide)
    return "\n".join(lines) + "\n"


def render_list(profile: dict) -> str:
    return "".join("GPU %d: %s (UUID: %s)\n" % (g["index"], g["name"], g["uuid"]) for g in profile["gpus"])


def render_version(profile: dict) -> str:
    driver = profile["driver_version"]
    nvml = ".".join(driver.split(".")[:2])
    return ("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\n"
            "CUDA Version        : %s\n" % (driver, nvml, driver, profile["cuda_version"]))


# --------------------------------------------------------------------------- queries

def _num(unit: str):
    """A value with a unit: '143771 MiB', or '143771' under nounits."""
    def fmt(value, nounits):
        if value is None or value == "N/A":
            return "[N/A]"
        return str(value) if nounits else "%s %s" % (value, unit)
    return fmt


def _plain(value, nounits):
    return "[N/A]" if value is None or value == "N/A" else str(value)


def _watts(value):
    return None if value in (None, "N/A") else "%.2f" % float(value)


def _pci_part(gpu, part):
    domain, bus, rest = gpu["pci_bus_id"].split(":")
    device = rest.split(".")[0]
    return {"domain": "0x" + domain[-4:], "bus": "0x" + bus, "device": "0x" + device}[part]


# canonical name -> (header unit or None, value formatter, getter(gpu, ctx))
QUERY_GPU_FIELDS = {
    "timestamp": (None, _plain, lambda g, c: time.strftime("%Y/%m/%d %H:%M:%S.000", time.localtime(c["now"]))),
    "driver_version": (None, _plain, lambda g, c: c["profile"]["driver_version"]),
    "count": (None, _plain, lambda g, c: len(c["profile"]["gpus"])),
    "name": (None, _plain, lambda g, c: g["name"]),
    "serial": (None, _plain, lambda g, c: g.get("serial", "N/A")),
    "uuid": (None, _plain, lambda g, c: g["uuid"]),
    "index": (None, _plain, lambda g, c: g["index"]),
    "pci.bus_id": (None, _plain, lambda g, c: g["pci_bus_id"]),
    "pci.domain": (None, _plain, lambda g, c: _pci_part(g, "domain")),
    "pci.bus": (None, _plain, lambda g, c: _pci_part(g, "bus")),
    "pci.device": (None, _plain, lambda g, c: _pci_part(g, "device")),
    "pci.device_id": (None, _plain, lambda g, c: "0x" + g["pci_device_id"]),
    "pci.sub_device_id": (None, _plain, lambda g, c: "0x" + g["pci_sub_system_id"]),
    "pcie.link.gen.current": (None, _plain, lambda g, c: g["pcie_gen_current"]),
    "pcie.link.gen.max": (None, _plain, lambda g, c: g["pcie_gen_max"]),
    "pcie.link.width.current": (None, _plain, lambda g, c: g["pcie_width_current"]),
    "pcie.link.width.max": (None, _plain, lambda g, c: g["pcie_width_max"]),
    "display_active": (None, _plain, lambda g, c: g["display_active"]),
    "persistence_mode": (None, _plain, lambda g, c: g["persistence_mode"]),
    "vbios_version": (None, _plain, lambda g, c: g["vbios_version"]),
    "compute_cap": (None, _plain, lambda g, c: g["compute_cap"]),
    "compute_mode": (None, _plain, lambda g, c: g["compute_mode"]),
    "pstate": (None, _plain, lambda g, c: g["perf_state"]),
    "fan.speed": ("%", _num("%"), lambda g, c: g["fan_speed"]),
    "memory.total": ("MiB", _num("MiB"), lambda g, c: c["memory"](g)[0]),
    "memory.reserved": ("MiB", _num("MiB"), lambda g, c: c["memory"](g)[1]),
    "memory.used": ("MiB", _num("MiB"), lambda g, c: c["memory"](g)[2]),
    "memory.free": ("MiB", _num("MiB"), lambda g, c: c["memory"](g)[3]),
    "utilization.gpu": ("%", _num("%"), lambda g, c: g["utilization_gpu"]),
    "utilization.memory": ("%", _num("%"), lambda g, c: g["utilization_memory"]),
    "ecc.mode.current": (None, _plain, lambda g, c: g["ecc_mode"]),
    "ecc.mode.pending": (None, _plain, lambda g, c: g["ecc_mode"]),
    "mig.mode.current": (None, _plain, lambda g, c: g["mig_mode"]),
    "mig.mode.pending": (None, _plain, lambda g, c: g["mig_mode"]),
    "temperature.gpu": (None, _plain, lambda g, c: g["temperature_c"]),
    "temperature.memory": (None, _plain, lambda g, c: g["memory_temperature_c"]),
    "power.draw": ("W", _num("W"), lambda g, c: _watts(g["power_draw_w"])),
    "power.draw.average": ("W", _num("W"), lambda g, c: _watts(g["power_draw_average_w"])),
    "power.draw.instant": ("W", _num("W"), lambda g, c: _watts(g["power_draw_w"])),
    "power.limit": ("W", _num("W"), lambda g, c: _watts(g["power_limit_w"])),
    "enforced.power.limit": ("W", _num("W"), lambda g, c: _watts(g["power_limit_w"])),
    "power.min_limit": ("W", _num("W"), lambda g, c: _watts(g["power_min_limit_w"])),
    "power.max_limit": ("W", _num("W"), lambda g, c: _watts(g["power_max_limit_w"])),
    "clocks.current.graphics": ("MHz", _num("MHz"), lambda g, c: g["clocks_graphics_mhz"]),
    "clocks.current.sm": ("MHz", _num("MHz"), lambda g, c: g["clocks_sm_mhz"]),
    "clocks.current.memory": ("MHz", _num("MHz"), lambda g, c: g["clocks_mem_mhz"]),
    "clocks.current.video": ("MHz", _num("MHz"), lambda g, c: g["clocks_video_mhz"]),
    "clocks.max.graphics": ("MHz", _num("MHz"), lambda g, c: g["clocks_max_graphics_mhz"]),
    "clocks.max.sm": ("MHz", _num("MHz"), lambda g, c: g["clocks_max_sm_mhz"]),
    "clocks.max.memory": ("MHz", _num("MHz"), lambda g, c: g["clocks_max_mem_mhz"]),
}
# Aliases the real tool accepts; its header shows the canonical name.
QUERY_GPU_FIELDS.update(fitness.QUERY_GPU_FIELDS if fitness else {})
QUERY_GPU_ALIASES = {
    **(fitness.QUERY_GPU_ALIASES if fitness else {}),
    "gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
    "clocks.gr": "clocks.current.graphics", "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory", "clocks.video": "clocks.current.video",
    "clocks.max.gr": "clocks.max.graphics", "clocks.max.mem": "clocks.max.memory",
}

QUERY_APPS_FIELDS = {
    "timestamp": (None, _plain, lambda p, c: time.strftime("%Y/%m/%d %H:%M:%S.000", time.localtime(c["now"]))),
    "gpu_name": (None, _plain, lambda p, c: c["by_index"][p["gpu"]]["name"]),
    "gpu_bus_id": (None, _plain, lambda p, c: c["by_index"][p["gpu"]]["pci_bus_id"]),
    "gpu_serial": (None, _plain, lambda p, c: c["by_index"][p["gpu"]].get("serial", "N/A")),
    "gpu_uuid": (None, _plain, lambda p, c: c["by_index"][p["gpu"]]["uuid"]),
    "pid": (None, _plain, lambda p, c: p["pid"]),
    "process_name": (None, _plain, lambda p, c: p["name"]),
    "used_gpu_memory": ("MiB", _num("MiB"), lambda p, c: p["mib"]),
}
QUERY_APPS_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def parse_format(spec: str | None) -> tuple[bool, bool] | None:
    """(header, units) for --format=csv[,noheader][,nounits]; None when invalid."""
    if spec is None:
        return None
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if "csv" not in parts or any(p not in ("csv", "noheader", "nounits") for p in parts):
        return None
    return "noheader" not in parts, "nounits" not in parts


def render_query(names: list[str], fields: dict, aliases: dict, rows: list, ctx: dict,
                 header: bool, units: bool) -> tuple[str, int]:
    canonical = []
    for raw in names:
        name = aliases.get(raw.strip(), raw.strip())
        if name not in fields:
            return 'Field "%s" is not a valid field to query.\n\n' % raw.strip(), EXIT_BAD_FIELD
        canonical.append(name)
    out = []
    if header:
        out.append(", ".join(n + (" [%s]" % fields[n][0] if fields[n][0] else "") for n in canonical))
    for row in rows:
        out.append(", ".join(fields[n][1](fields[n][2](row, ctx), not units) for n in canonical))
    return "".join(line + "\n" for line in out), 0


# --------------------------------------------------------------------------- topology

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def render_topo(profile: dict) -> str:
    gpus = profile["gpus"]
    topo = profile.get("topology", {})
    n = len(gpus)
    matrix = topo.get("matrix") or [["X" if i == j else "SYS" for j in range(n)] for i in range(n)]
    nics = topo.get("nics", [])
    cpu = topo.get("cpu_affinity") or ["N/A"] * n
    numa = topo.get("numa_affinity") or ["N/A"] * n
    gpu_numa = topo.get("gpu_numa_id") or ["N/A"] * n
    names = ["GPU%d" % g["index"] for g in gpus] + ["NIC%d" % i for i in range(len(nics))]

    def cell(value: str) -> str:
        return " X " if value == "X" else value

    lines = ["\t\x1b[4m" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    for i in range(n):
        row = [cell(matrix[i][j]) for j in range(n)] + [nic["links"][i] for nic in nics]
        lines.append("\t".join(["GPU%d" % gpus[i]["index"]] + row + [cpu[i], numa[i], "", gpu_numa[i]]))
    nic_matrix = topo.get("nic_matrix") or [["X" if a == b else "NODE" for b in range(len(nics))]
                                             for a in range(len(nics))]
    for k, nic in enumerate(nics):
        row = list(nic["links"]) + [cell(v) for v in nic_matrix[k]]
        lines.append("\t".join(["NIC%d" % k] + row + ["", "", "", ""]))
    text = "\n".join(lines) + "\n" + LEGEND
    if nics:
        text += "\nNIC Legend:\n\n" + "".join("  NIC%d: %s\n" % (k, nic["name"]) for k, nic in enumerate(nics))
    return text


# --------------------------------------------------------------------------- XML

def _xml_processes(procs: list[dict]) -> str:
    if not procs:
        return "\t\t<processes>\n\t\t</processes>\n"
    out = "\t\t<processes>\n"
    for p in procs:
        out += ("\t\t\t<process_info>\n"
                "\t\t\t\t<gpu_instance_id>N/A</gpu_instance_id>\n"
                "\t\t\t\t<compute_instance_id>N/A</compute_instance_id>\n"
                "\t\t\t\t<pid>%d</pid>\n\t\t\t\t<type>%s</type>\n"
                "\t\t\t\t<process_name>%s</process_name>\n"
                "\t\t\t\t<used_memory>%d MiB</used_memory>\n"
                "\t\t\t</process_info>\n") % (p["pid"], p["type"], _xml_escape(p["name"]), p["mib"])
    return out + "\t\t</processes>\n"


def _xml_escape(text: str) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _xml_clocks(gpu: dict) -> str:
    out = "\t\t<supported_clocks>\n"
    top = int(gpu["clocks_max_graphics_mhz"])
    low = int(gpu["supported_graphics_clock_min_mhz"])
    step = int(gpu["supported_graphics_clock_step_mhz"])
    for mem in gpu["supported_mem_clocks_mhz"]:
        out += "\t\t\t<supported_mem_clock>\n\t\t\t\t<value>%d MHz</value>\n" % mem
        for clk in range(top, low - 1, -step):
            out += "\t\t\t\t<supported_graphics_clock>%d MHz</supported_graphics_clock>\n" % clk
        out += "\t\t\t</supported_mem_clock>\n"
    return out + "\t\t</supported_clocks>\n"


def render_xml(profile: dict, used: dict[int, int], processes: list[dict], now: float) -> str:
    head = ('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
            "<nvidia_smi_log>\n\t<timestamp>%s</timestamp>\n\t<driver_version>%s</driver_version>\n"
            "\t<cuda_version>%s</cuda_version>\n\t<attached_gpus>%d</attached_gpus>\n") % (
        time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(now)), profile["driver_version"],
        profile["cuda_version"], len(profile["gpus"]))
    template = _xml_gpu_template()
    if fitness is None:
        raise StandInError(f"rehearsal nvidia-smi: cannot import nvidia_smi_fitness.py: keep it in the same directory "
                           f"as {os.path.realpath(__file__)}")
    body = ""
    for gpu in profile["gpus"]:
        total, reserved, mem_used, free = memory(gpu, used.get(gpu["index"], 0))
        domain, bus, rest = gpu["pci_bus_id"].split(":")
        device = rest.split(".")[0]
        values = dict(gpu)
        values.update(
            total=total, reserved=reserved, used=mem_used, free=free,
            bar1_free=int(gpu["bar1_total_mib"]) - int(gpu["bar1_used_mib"]),
            pci_bus=bus, pci_device=device, pci_domain=domain[-4:],
            persistence=gpu["persistence_mode"], fan=_xml_fan(gpu["fan_speed"]),
            power_draw="%.2f W" % float(gpu["power_draw_w"]),
            power_avg="%.2f W" % float(gpu["power_draw_average_w"]),
            power_limit="%.2f W" % float(gpu["power_limit_w"]),
            power_min="%.2f W" % float(gpu["power_min_limit_w"]),
            power_max="%.2f W" % float(gpu["power_max_limit_w"]),
            serial=gpu.get("serial", "N/A"), board_id="0x%x" % int(gpu.get("board_id", gpu["index"])),
            module_id=gpu.get("module_id", "N/A"), name=_xml_escape(gpu["name"]),
            memory_power="N/A" if gpu["memory_power_draw_w"] is None
            else "%.2f W" % float(gpu["memory_power_draw_w"]),
            **fitness.xml_values(gpu),
        )
        body += template.format(**values)
        body += _xml_clocks(gpu)
        body += _xml_processes([p for p in processes if p["gpu"] == gpu["index"]])
        body += ("\t\t<accounted_processes>\n\t\t</accounted_processes>\n"
                 "\t\t<capabilities>\n\t\t\t<egm>disabled</egm>\n\t\t</capabilities>\n\t</gpu>\n\n")
    return head + body + "</nvidia_smi_log>\n"


def _xml_fan(value) -> str:
    return "N/A" if value == "N/A" else "%d %%" % int(value)


# One <gpu> element of `nvidia-smi -q -x` up to <supported_clocks>, in the order and nesting of
# the driver 580 capture (tests/data/nvidia/h200-1gpu/nvidia-smi-q.xml): a str.format template
# in a data file next to this script, so the whole directory is what goes onto a host.
XML_GPU_TEMPLATE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "nvidia_smi_gpu.xml.template")


def _xml_gpu_template() -> str:
    try:
        with open(XML_GPU_TEMPLATE, encoding="utf-8", newline="") as f:
            return f.read()
    except OSError as exc:
        raise StandInError(f"rehearsal nvidia-smi: cannot read the -q -x template {XML_GPU_TEMPLATE} ({exc}): "
                           "keep nvidia_smi_gpu.xml.template in the same directory as nvidia_smi.py")


# --------------------------------------------------------------------------- command line

def _select(profile: dict, ids: str | None) -> list[dict] | None:
    """GPUs named by -i/--id (indices, UUIDs or PCI bus ids, comma-separated)."""
    if ids is None:
        return profile["gpus"]
    chosen = []
    for token in (t.strip() for t in ids.split(",")):
        match = [g for g in profile["gpus"]
                 if token == str(g["index"]) or token == g["uuid"] or token.lower() == g["pci_bus_id"].lower()]
        if not match:
            return None
        chosen.extend(m for m in match if m not in chosen)
    return chosen


def _options(argv: list[str]) -> dict | None:
    """The real tool's options this stand-in knows, as a dict; None for anything else."""
    opts: dict = {"flags": set()}
    valued = {"--query-gpu": "query_gpu", "--query-compute-apps": "query_apps", "--format": "format",
              "-i": "id", "--id": "id", "-f": "file", "--filename": "file"}
    flags = {"-L": "list", "--list-gpus": "list", "-q": "query", "--query": "query", "-x": "xml",
             "--xml-format": "xml", "--version": "version", "-h": "help", "--help": "help",
             "--help-query-gpu": "help_query_gpu", "-m": "matrix", "--matrix": "matrix"}
    i = 0
    if argv and argv[0] == "topo":
        opts["flags"].add("topo")
        i = 1
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in valued:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                value = argv[i + 1]
                i += 1
            opts[valued[key]] = value
        elif arg in flags:
            opts["flags"].add(flags[arg])
        elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 2 and all(
                "-" + c in flags for c in arg[1:]):
            opts["flags"].update(flags["-" + c] for c in arg[1:])  # -qx
        else:
            return None
        i += 1
    return opts


HELP = """NVIDIA System Management Interface -- rehearsal stand-in (no GPU, no driver).

Answers from the hardware profile in $REHEARSAL_GPU_PROFILE (default %s).
Supported: nvidia-smi | -L | --version | --query-gpu=... --format=csv[,noheader][,nounits] [-i ID]
           | --query-compute-apps=... --format=csv[,...] | --help-query-gpu | topo -m | -q -x
""" % DEFAULT_PROFILE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    opts = _options(argv)
    if opts is None:
        sys.stdout.write(BAD_ARGS)
        return EXIT_BAD_ARGS
    flags = opts["flags"]
    if "help" in flags:
        sys.stdout.write(HELP)
        return 0
    if "help_query_gpu" in flags:
        sys.stdout.write("".join('"%s"\n' % name for name in QUERY_GPU_FIELDS))
        return 0
    try:
        profile = load_profile(os.environ.get("REHEARSAL_GPU_PROFILE", DEFAULT_PROFILE))
    except ProfileError as exc:
        sys.stdout.write(NO_DRIVER)
        sys.stderr.write(str(exc) + "\n")
        return EXIT_NO_DRIVER
    used, processes = engine_usage(os.environ.get("REHEARSAL_GPU_STATE_DIR", DEFAULT_STATE_DIR))
    now = time.time()
    out = sys.stdout

    if "topo" in flags:
        if flags != {"topo", "matrix"}:
            out.write(BAD_ARGS)
            return EXIT_BAD_ARGS
        out.write(render_topo(profile))
        return 0
    if "version" in flags:
        out.write(render_version(profile))
        return 0
    if "list" in flags:
        out.write(render_list(profile))
        return 0
    selected = _select(profile, opts.get("id"))
    if selected is None:
        out.write("No devices were found\n")
        return 6
    shown = {**profile, "gpus": selected}
    if "query_gpu" in opts or "query_apps" in opts:
        fmt = parse_format(opts.get("format"))
        if fmt is None or flags:
            out.write(BAD_ARGS)
            return EXIT_BAD_ARGS
        ctx = {"profile": profile, "now": now, "by_index": {g["index"]: g for g in profile["gpus"]},
               "memory": lambda g: memory(g, used.get(g["index"], 0))}
        if "query_gpu" in opts:
            text, code = render_query(opts["query_gpu"].split(","), QUERY_GPU_FIELDS, QUERY_GPU_ALIASES,
                                      selected, ctx, *fmt)
        else:
            wanted = {g["index"] for g in selected}
            text, code = render_query(opts["query_apps"].split(","), QUERY_APPS_FIELDS, QUERY_APPS_ALIASES,
                                      [p for p in processes if p["gpu"] in wanted], ctx, *fmt)
        out.write(text)
        return code
    if "query" in flags:
        if "xml" not in flags:
            sys.stderr.write("rehearsal nvidia-smi: only the XML form of -q is simulated (use -q -x)\n")
            out.write(BAD_ARGS)
            return EXIT_BAD_ARGS
        try:
            text = render_xml(shown, used, processes, now)
        except StandInError as exc:
            sys.stdout.write(NO_DRIVER)
            sys.stderr.write(str(exc) + "\n")
            return EXIT_NO_DRIVER
        out.write(text)
        return 0
    if flags or "format" in opts:
        out.write(BAD_ARGS)
        return EXIT_BAD_ARGS
    out.write(render_table(shown, used, processes, now))
    return 0


if __name__ == "__main__":
    sys.exit(main())
