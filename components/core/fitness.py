"""A machine's performance fitness: the facts that change a benchmark's figures without stopping
the server (power limit, clocks, PCIe link, persistence, ECC and retired memory, driver, CUDA
and NCCL versions, IOMMU and ACS), read in the host-facts round trip and parsed here.

Pure: parsers over command output (real captures under tests/data/nvidia/, cases under
tests/data/facts/), and what each reading says is degraded now. The comparison with a
benchmark's baseline is `fitness_baseline.py`.

Where each fact comes from:
- `nvidia-smi -q -x`, cut on the host to the elements read here (`XML_FILTER`: a whole report is
  ~27 kB a GPU, most of it the list of supported clocks): power limits, clocks, persistence,
  ECC mode, retired pages and remapped rows, the PCIe link, driver and CUDA versions;
- the system's libnccl (`ldconfig -p`); the NCCL the serving venv loads (pip's `nvidia-nccl-cu*`,
  which torch prefers) is in the venv's own read, added by `with_venv_nccl`;
- `/sys/kernel/iommu_groups` and `/proc/cmdline` (IOMMU), `lspci -vvv` (ACS redirection on
  PCIe bridges: with it peer-to-peer traffic goes through the root complex; lspci shows the
  capability to root only, so elsewhere it is unknown).
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

# The children of <gpu> kept by XML_FILTER; the parser reads nothing else.
XML_SECTIONS = ("product_name", "uuid", "persistence_mode", "pci", "performance_state", "clocks_event_reasons",
                "clocks_throttle_reasons", "ecc_mode", "retired_pages", "remapped_rows", "gpu_power_readings",
                "power_readings", "clocks", "applications_clocks", "default_applications_clocks", "max_clocks")

# Keeps the report's top level and the <gpu> children above, by the tool's tab indentation (one
# element a line). Output it does not recognise passes whole, so the parser still reads it.
XML_FILTER = r"""awk -v keep=" %s " '
{ line = $0; sub(/^\t*/, "", line); depth = length($0) - length(line) }
depth < 2 { print; next }
depth == 2 && line ~ /^<\// { if (on) print; next }
depth == 2 { name = line; sub(/^</, "", name); sub(/[ >\/].*/, "", name); on = index(keep, " " name " ") != 0 }
on { print }'""" % " ".join(XML_SECTIONS)

# The system's NCCL (`system <the library file>`, or nothing). The NCCL torch loads in the serving
# venv (pip's nvidia-nccl-cu*) is in the venv's read (its distributions): `with_venv_nccl`.
NCCL_SCRIPT = r"""p=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so/ { print $NF; exit }')
[ -n "$p" ] && echo "system $(readlink -f "$p")" || true"""

# IOMMU groups (the kernel made some: an IOMMU is on), the kernel's command line, and each PCIe
# function with an ACS control register, on one line with it.
IOMMU_SCRIPT = r"""echo "groups $(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l)"
echo "cmdline $(cat /proc/cmdline 2>/dev/null)"
if command -v lspci >/dev/null 2>&1; then
  lspci -vvv 2>/dev/null | awk '/^[0-9a-f]/ { dev = $1 } /ACSCtl:/ { sub(/^[ \t]*/, ""); print "acs " dev " " $0 }'
  echo "lspci $(id -u)"
fi"""

# The clock event reasons that hold clocks below what the GPU could run (gpu_idle is not one).
LIMITING_REASONS = ("applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown", "sw_thermal_slowdown")


class FitnessError(ValueError):
    """Output that is not nvidia-smi's XML report."""


@dataclass(frozen=True)
class GpuFitness:
    """One GPU's fitness facts. None: the GPU or the driver does not report it ("N/A")."""
    index: int = 0
    uuid: str = ""
    name: str = ""
    bus_id: str = ""
    persistence_mode: Optional[str] = None  # Enabled / Disabled
    perf_state: Optional[str] = None  # P0 ... P12
    power_limit_w: Optional[float] = None  # enforced now
    power_default_limit_w: Optional[float] = None
    power_max_limit_w: Optional[float] = None
    clocks_sm_mhz: Optional[int] = None  # now (idle: low; a reading, not a setting)
    clocks_mem_mhz: Optional[int] = None
    clocks_max_sm_mhz: Optional[int] = None
    clocks_max_mem_mhz: Optional[int] = None
    applications_graphics_mhz: Optional[int] = None  # the target clocks (`nvidia-smi -ac`)
    applications_mem_mhz: Optional[int] = None
    default_applications_graphics_mhz: Optional[int] = None
    default_applications_mem_mhz: Optional[int] = None
    clock_limits: tuple[str, ...] = ()  # LIMITING_REASONS active now
    ecc_mode: Optional[str] = None  # Enabled / Disabled
    ecc_pending: Optional[str] = None  # what the next reboot sets
    retired_pages_sbe: Optional[int] = None  # pages retired after repeated single-bit errors
    retired_pages_dbe: Optional[int] = None  # ... after a double-bit error
    retired_pages_pending: Optional[bool] = None  # retirement waits for a reboot
    remapped_rows_correctable: Optional[int] = None  # row remapping (Ampere and later, HBM)
    remapped_rows_uncorrectable: Optional[int] = None
    remapped_rows_pending: Optional[bool] = None
    remapped_rows_failure: Optional[bool] = None
    pcie_gen_current: Optional[int] = None
    pcie_gen_max: Optional[int] = None  # of the GPU and the slot together
    pcie_width_current: Optional[int] = None
    pcie_width_max: Optional[int] = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GpuFitness":
        """Back from `asdict` (Pulumi state drops nulls: every field has a default)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in (d or {}).items() if k in names}
        values["clock_limits"] = tuple(values.get("clock_limits") or ())
        return cls(**values)

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id})" if self.bus_id else f"GPU {self.index}"


@dataclass(frozen=True)
class HostFitness:
    driver_version: str = ""
    cuda_version: str = ""
    nccl_version: Optional[str] = None  # None: no NCCL found where the script looks
    nccl_source: Optional[str] = None  # "pip" (the serving venv's) or "system"
    iommu: Optional[bool] = None  # IOMMU groups exist: the IOMMU translates DMA
    iommu_cmdline: tuple[str, ...] = ()  # the kernel's iommu parameters (intel_iommu=on, iommu=pt)
    acs_bridges: Optional[int] = None  # PCIe functions with an ACS control register (None: unreadable)
    acs_redirecting: Optional[int] = None  # ... of which redirect requests upstream (SrcValid/ReqRedir on)
    gpus: tuple[GpuFitness, ...] = ()
    problems: tuple[str, ...] = ()  # what could not be read, and why

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> Optional["HostFitness"]:
        if not d:
            return None
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in names}
        values["gpus"] = tuple(GpuFitness.from_dict(g) for g in values.get("gpus") or ())
        values["iommu_cmdline"] = tuple(values.get("iommu_cmdline") or ())
        values["problems"] = tuple(values.get("problems") or ())
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- nvidia-smi -q -x

_DOCTYPE = re.compile(r"<!DOCTYPE[^>]*>")


def _text(node: Optional[ET.Element], path: str) -> Optional[str]:
    value = node.findtext(path) if node is not None else None
    if value is None:
        return None
    value = value.strip()
    return None if value in ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error") else value


def _number(value: Optional[str], unit: str = "") -> Optional[float]:
    """'700.00 W' -> 700.0, '16x' -> 16.0; None for N/A or anything else."""
    if value is None:
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*" + re.escape(unit), value, re.ASCII)
    return float(m.group(1)) if m else None


def _int(value: Optional[str], unit: str = "") -> Optional[int]:
    n = _number(value, unit)
    return None if n is None else int(n)


def _yes(value: Optional[str]) -> Optional[bool]:
    return None if value is None else value.lower() in ("yes", "active", "enabled")


def _gpu(index: int, g: ET.Element) -> GpuFitness:
    power = g.find("gpu_power_readings")
    if power is None:
        power = g.find("power_readings")  # drivers before 535
    reasons = g.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if reasons is None:
        reasons, prefix = g.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    limits = tuple(r for r in LIMITING_REASONS if _yes(_text(reasons, prefix + r)))
    link = g.find("pci/pci_gpu_link_info")
    return GpuFitness(
        index=index, uuid=_text(g, "uuid") or "", name=_text(g, "product_name") or "", bus_id=g.get("id", ""),
        persistence_mode=_text(g, "persistence_mode"), perf_state=_text(g, "performance_state"),
        power_limit_w=_number(_text(power, "current_power_limit") or _text(power, "enforced_power_limit"), "W"),
        power_default_limit_w=_number(_text(power, "default_power_limit"), "W"),
        power_max_limit_w=_number(_text(power, "max_power_limit"), "W"),
        clocks_sm_mhz=_int(_text(g, "clocks/sm_clock"), "MHz"), clocks_mem_mhz=_int(_text(g, "clocks/mem_clock"), "MHz"),
        clocks_max_sm_mhz=_int(_text(g, "max_clocks/sm_clock"), "MHz"),
        clocks_max_mem_mhz=_int(_text(g, "max_clocks/mem_clock"), "MHz"),
        applications_graphics_mhz=_int(_text(g, "applications_clocks/graphics_clock"), "MHz"),
        applications_mem_mhz=_int(_text(g, "applications_clocks/mem_clock"), "MHz"),
        default_applications_graphics_mhz=_int(_text(g, "default_applications_clocks/graphics_clock"), "MHz"),
        default_applications_mem_mhz=_int(_text(g, "default_applications_clocks/mem_clock"), "MHz"),
        clock_limits=limits,
        ecc_mode=_text(g, "ecc_mode/current_ecc"), ecc_pending=_text(g, "ecc_mode/pending_ecc"),
        retired_pages_sbe=_int(_text(g, "retired_pages/multiple_single_bit_retirement/retired_count")),
        retired_pages_dbe=_int(_text(g, "retired_pages/double_bit_retirement/retired_count")),
        retired_pages_pending=_yes(_text(g, "retired_pages/pending_retirement")),
        remapped_rows_correctable=_int(_text(g, "remapped_rows/remapped_row_corr")),
        remapped_rows_uncorrectable=_int(_text(g, "remapped_rows/remapped_row_unc")),
        remapped_rows_pending=_yes(_text(g, "remapped_rows/remapped_row_pending")),
        remapped_rows_failure=_yes(_text(g, "remapped_rows/remapped_row_failure")),
        pcie_gen_current=_int(_text(link, "pcie_gen/current_link_gen")),
        pcie_gen_max=_int(_text(link, "pcie_gen/max_link_gen")),
        pcie_width_current=_int(_text(link, "link_widths/current_link_width"), "x"),
        pcie_width_max=_int(_text(link, "link_widths/max_link_width"), "x"),
    )


def parse_smi_xml(text: str) -> tuple[str, str, list[GpuFitness]]:
    """(driver, CUDA, GPUs) from ``nvidia-smi -q -x``, whole or cut by `XML_FILTER`."""
    if "<!ENTITY" in text:  # the tool never declares entities; a report that does is not its own
        raise FitnessError("nvidia-smi -q -x: the report declares XML entities; nvidia-smi never does")
    try:
        root = ET.fromstring(_DOCTYPE.sub("", text.strip(), count=1))
    except ET.ParseError as exc:
        raise FitnessError(f"nvidia-smi -q -x: not the tool's XML report ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise FitnessError(f"nvidia-smi -q -x: the report's root is <{root.tag}>, not <nvidia_smi_log>")
    gpus = [_gpu(i, g) for i, g in enumerate(root.findall("gpu"))]
    return root.findtext("driver_version", "").strip(), root.findtext("cuda_version", "").strip(), gpus


# --------------------------------------------------------------------------- NCCL, IOMMU, ACS

def parse_nccl(text: str) -> tuple[Optional[str], Optional[str]]:
    """(version, "system") from NCCL_SCRIPT's answer: the library file's name carries it."""
    for line in text.splitlines():
        kind, _, what = line.strip().partition(" ")
        if kind == "system":
            m = re.fullmatch(r".*libnccl\.so\.([0-9]+(?:\.[0-9]+)+)", what)
            return (m.group(1) if m else "unknown"), "system"
    return None, None


# pip's names of NCCL, by CUDA major (the venv read normalizes names: lower case, dashes).
NCCL_DISTRIBUTIONS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def with_venv_nccl(f: HostFitness, packages: dict[str, str]) -> HostFitness:
    """The fitness with the NCCL the serving venv loads (`packages`: the venv read's normalized
    name -> version), which torch prefers over the system's."""
    for name in NCCL_DISTRIBUTIONS:
        if name in packages:
            return replace(f, nccl_version=str(packages[name]), nccl_source="pip")
    return f


def parse_iommu(text: str) -> dict[str, Any]:
    """IOMMU and ACS from IOMMU_SCRIPT's answer."""
    groups, cmdline, acs, lspci_uid = None, "", [], None
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "groups" and rest.strip().isdigit():
            groups = int(rest.strip())
        elif kind == "cmdline":
            cmdline = rest
        elif kind == "acs":
            acs.append(rest)
        elif kind == "lspci":
            lspci_uid = rest.strip()
    params = tuple(w for w in cmdline.split() if re.match(r"(intel_iommu|amd_iommu|iommu)(=|\.)", w))
    readable = lspci_uid == "0"  # lspci shows capabilities to root only
    redirecting = sum(1 for a in acs if re.search(r"\b(SrcValid|ReqRedir)\+", a, re.ASCII))
    return {"iommu": None if groups is None else groups > 0, "iommu_cmdline": params,
            "acs_bridges": len(acs) if readable else None, "acs_redirecting": redirecting if readable else None}


def parse_fitness(xml: str, nccl: str = "", iommu: str = "") -> HostFitness:
    """The fitness sections of the facts answer. nvidia-smi's failure (`@@rc=N`) or a report that
    is not its own is a problem of the reading, not an error: the other facts stand."""
    problems: list[str] = []
    failed = re.search(r"^@@rc=([0-9]+)", xml, re.M)
    driver = cuda = ""
    gpus: list[GpuFitness] = []
    if failed:
        said = xml[:failed.start()].strip()
        problems.append(f"nvidia-smi -q -x exited {failed.group(1)}: {said[:200] or '(no output)'}")
    elif not xml.strip():
        problems.append("nvidia-smi -q -x printed nothing")
    else:
        try:
            driver, cuda, gpus = parse_smi_xml(xml)
        except FitnessError as exc:
            problems.append(str(exc))
    version, source = parse_nccl(nccl)
    return HostFitness(driver_version=driver, cuda_version=cuda, nccl_version=version, nccl_source=source,
                       gpus=tuple(gpus), problems=tuple(problems), **parse_iommu(iommu))


# --------------------------------------------------------------------------- degraded now

def _watts(w: Optional[float]) -> str:
    return "?" if w is None else f"{w:g} W"


def gpu_degradations(g: GpuFitness) -> list[str]:
    """What holds this GPU below what it can do, read now without a baseline."""
    out = []
    if g.power_limit_w is not None and g.power_default_limit_w and g.power_limit_w < g.power_default_limit_w - 0.5:
        out.append(f"power capped at {_watts(g.power_limit_w)} (default {_watts(g.power_default_limit_w)})")
    if (g.applications_graphics_mhz and g.default_applications_graphics_mhz
            and g.applications_graphics_mhz < g.default_applications_graphics_mhz):
        out.append(f"applications clocks at {g.applications_graphics_mhz} MHz (default {g.default_applications_graphics_mhz} MHz)")
    if "applications_clocks_setting" in g.clock_limits:
        out.append("clocks held by an applications-clocks or locked-clocks setting")
    if g.pcie_width_current and g.pcie_width_max and g.pcie_width_current < g.pcie_width_max:
        out.append(f"PCIe link x{g.pcie_width_current} of x{g.pcie_width_max}")
    # At idle a GPU trains its link down to save power: only a link at P0 says the slot is slow.
    if g.perf_state == "P0" and g.pcie_gen_current and g.pcie_gen_max and g.pcie_gen_current < g.pcie_gen_max:
        out.append(f"PCIe link Gen{g.pcie_gen_current} of Gen{g.pcie_gen_max}")
    if g.persistence_mode == "Disabled":
        out.append("persistence mode off (the driver unloads between uses: every start pays its load)")
    if g.ecc_mode and g.ecc_pending and g.ecc_pending != g.ecc_mode:
        out.append(f"ECC {g.ecc_mode.lower()} now, {g.ecc_pending.lower()} after the next reboot")
    if g.retired_pages_pending or g.remapped_rows_pending:
        out.append("retired memory pending a reboot (ECC errors)")
    if g.remapped_rows_failure:
        out.append("row remapping failed: the GPU needs service")
    return out


def degradations(f: HostFitness) -> list[str]:
    """Every degradation of the host now, as `<GPU>: <what>` lines (status shows them)."""
    out = [f"{g.label}: {d}" for g in f.gpus for d in gpu_degradations(g)]
    if f.acs_redirecting:
        out.append(f"ACS redirects peer-to-peer traffic through the root complex on {f.acs_redirecting} "
                   f"of {f.acs_bridges} PCIe functions")
    return out
