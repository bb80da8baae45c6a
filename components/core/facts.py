"""Parsers of what a host says about itself, and the check of those facts against the stack.

Pure functions over command output (tested with real captures under tests/data/facts/). The
commands themselves are listed here too, so the remote layer reads every fact in one SSH
round trip (`FACTS_SCRIPT`), the way pyinfra's facts pair a command with its parser.
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .fitness import IOMMU_SCRIPT, NCCL_SCRIPT, XML_FILTER, HostFitness, parse_fitness
from .fitness_baseline import BASELINE_FILE

GPU_FIELDS = ["index", "uuid", "name", "memory.total", "driver_version", "pci.bus_id"]
GPU_QUERY = ["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class FactError(ValueError):
    """Output that does not look like what the tool prints."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int
    uuid: str = ""
    driver_version: str = ""
    bus_id: str = ""


def parse_query_gpu(text: str, fields: list[str] = GPU_FIELDS) -> list[Gpu]:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``."""
    gpus = []
    for row in csv.reader(io.StringIO(text.strip()), skipinitialspace=True):
        if not row:
            continue
        if len(row) != len(fields):
            raise FactError(f"nvidia-smi --query-gpu: expected {len(fields)} columns, got {len(row)}: {row!r}")
        values = dict(zip(fields, (v.strip() for v in row)))
        try:
            gpus.append(Gpu(index=int(values["index"]), name=values.get("name", ""),
                            memory_mib=int(float(values["memory.total"])), uuid=values.get("uuid", ""),
                            driver_version=values.get("driver_version", ""), bus_id=values.get("pci.bus_id", "")))
        except (KeyError, ValueError) as exc:
            raise FactError(f"nvidia-smi --query-gpu: unreadable row {row!r} ({exc})") from None
    return gpus


def parse_smi_header(text: str) -> dict[str, str]:
    """Driver and CUDA (driver API) versions from the banner of plain ``nvidia-smi``."""
    out = {}
    m = re.search(r"Driver Version:\s*([0-9.]+)", text, re.ASCII)
    if m:
        out["driver_version"] = m.group(1)
    m = re.search(r"CUDA Version:\s*([0-9.]+)", text, re.ASCII)
    if m:
        out["cuda_version"] = m.group(1)
    return out


def parse_topo(text: str) -> dict[str, object]:
    """``nvidia-smi topo -m``: the GPU-to-GPU link matrix and the interconnect it implies.

    NV# means # bonded NVLinks; PIX/PXB/PHB/NODE/SYS are PCIe paths. A host is "nvlink" when
    every GPU pair is linked by NVLink, "pcie" otherwise (a partial NVLink box is "mixed").
    """
    lines = [_ANSI.sub("", ln).rstrip("\n") for ln in text.splitlines()]
    header = next((ln for ln in lines if ln.strip().startswith("GPU0")), None)
    if header is None:
        raise FactError("nvidia-smi topo -m: no GPU header line")
    columns = [c.strip() for c in header.strip().split("\t") if c.strip()]
    gpu_cols = [c for c in columns if re.fullmatch(r"GPU[0-9]+", c)]
    links: dict[str, dict[str, str]] = {}
    for line in lines:
        cells = line.split("\t")
        name = cells[0].strip()
        if re.fullmatch(r"GPU[0-9]+", name) and line is not header and len(cells) > len(gpu_cols):
            links[name] = {gpu_cols[i]: cells[i + 1].strip() for i in range(len(gpu_cols))}
    pairs = [links[a][b] for a in links for b in links[a] if a != b]
    if not pairs:
        kind = "single"
    elif all(p.startswith("NV") for p in pairs):
        kind = "nvlink"
    elif any(p.startswith("NV") for p in pairs):
        kind = "mixed"
    else:
        kind = "pcie"
    return {"gpus": len(gpu_cols), "interconnect": kind, "links": links}


def parse_nvcc(text: str) -> Optional[str]:
    """Toolkit version ("13.0") from ``nvcc --version``; None when nvcc is absent."""
    m = re.search(r"release ([0-9]+\.[0-9]+), V[0-9.]+", text)
    return m.group(1) if m else None


def parse_os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


# The `systemctl show` properties of a unit, one list for every read of one: the scripts that read
# units (reads.POLL_SCRIPT and SERVICE_SCRIPT, status.SERVING_SCRIPT, switch.MANAGED_UNITS_SCRIPT,
# probe.START_SCRIPT) ask for all of them, whatever each needs, so a parser never looks for a name
# its script did not ask for (tests/test_facts.py checks every name the parsers read is here).
# A dozen short lines per unit; Exec* properties (multi-line values) are never among them.
UNIT_PROPERTIES = (
    "Id",  # the unit's name (empty for a unit systemd does not know)
    "ActiveState", "UnitFileState", "LoadState",
    "NeedDaemonReload",  # the unit file changed under systemd: daemon-reload before a start
    "MainPID", "NRestarts", "SubState", "Result", "ExecMainStatus",
    "ActiveEnterTimestamp",  # shown as "since" (status)
    "ActiveEnterTimestampMonotonic",  # the uptime, against /proc/uptime (status)
    "DropInPaths",  # drop-ins that change the unit (`systemctl edit` makes one): hand edits (unit.own_drop_ins)
)
# The options that ask for them, for a script (`systemctl show $SHOW_OPTIONS -- unit...`).
SHOW_OPTIONS = " ".join(f"-p {p}" for p in UNIT_PROPERTIES)
# The unit's environment as systemd holds it (dropins.py parses it), asked apart from the list:
# EnvironmentFiles repeats its key, a line per file, which parse_systemctl_show would not keep.
ENVIRONMENT_PROPERTIES = ("Environment", "EnvironmentFiles", "UnsetEnvironment", "PassEnvironment")
ENVIRONMENT_SHOW_OPTIONS = " ".join(f"-p {p}" for p in ENVIRONMENT_PROPERTIES)


def show_options() -> list[str]:
    """SHOW_OPTIONS as argv words (`systemctl show *show_options() -- unit...`)."""
    return [w for p in UNIT_PROPERTIES for w in ("-p", p)]


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """``systemctl show -p A -p B unit1 unit2``: blocks separated by blank lines, one per unit,
    keyed by each block's ``Id``. Only Exec* values span lines, and we never ask for those."""
    units: dict[str, dict[str, str]] = {}
    for block in re.split(r"\n\s*\n", text.strip(), flags=re.ASCII):
        props = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key] = value
        if props:
            units[props.get("Id", f"#{len(units)}")] = props
    return units


# One script, one SSH round trip for every fact. Markers split the sections; each command's
# failure is part of the answer (no nvcc yet = no toolkit), not an error of the read. The last
# line, @@end, says the answer is whole: without it (a connection lost mid-answer) an empty
# section would read as "no GPUs" or "no toolkit", so `parse_facts` refuses the answer instead.
#
# The three nvidia-smi calls and nvcc run at once (each takes 0.1 s to seconds: the driver's
# start, a Python stand-in on a rehearsal host; one after the other they were most of a drift
# check's first read, docs/benchmarks.md, issue 18), and the answer is the same text as if they
# had run in turn: every line of a section is tagged with the section's number as it is printed
# (awk, one write per line: lines of concurrent sections never mix within a line), a stable sort
# by that number puts the sections back in order with each one's lines as printed, and the tag
# goes. Nothing is written on the host (no temporary file: a read writes nothing).
FACTS_SCRIPT = r"""
tag() { awk -v n="$1" '{ print n " " $0; fflush() }'; }
{ { echo '@@query'; nvidia-smi {query} 2>&1 || echo "@@rc=$?"; } | tag 1 &
  { echo '@@smi'; nvidia-smi 2>&1 | head -n 6; } | tag 2 &
  { echo '@@topo'; nvidia-smi topo -m 2>&1; } | tag 3 &
  { echo '@@nvcc'; "$1/bin/nvcc" --version 2>&1 || echo "@@rc=$?"; } | tag 4 &
  { echo '@@fitness'; { nvidia-smi -q -x 2>&1 || echo "@@rc=$?"; } | {xml_filter}; } | tag 5 &
  { echo '@@iommu'; {iommu}; } | tag 6 &
  wait; } | sort -s -n -k1,1 | cut -d ' ' -f 2-
echo '@@nccl'; {nccl}
echo '@@baseline'; cat {baseline} 2>/dev/null
echo '@@os'; cat /etc/os-release
echo '@@kernel'; uname -r
echo '@@end'
""".replace("{query}", " ".join(GPU_QUERY[1:])).replace("{xml_filter}", XML_FILTER).replace("{iommu}", IOMMU_SCRIPT) \
    .replace("{nccl}", NCCL_SCRIPT).replace("{baseline}", BASELINE_FILE)
# $1: the CUDA home (nvcc). The fitness sections (core/fitness.py) are read with the rest, and the
# host's fitness baseline (core/fitness_baseline.py: the drift check compares the two): one round
# trip still.
FACTS_SECTIONS = ("query", "smi", "topo", "nvcc", "fitness", "iommu", "nccl", "baseline", "os", "kernel", "end")
# The sections an answer must have to be whole. Not the baseline: it is the drift check's, not a
# fact (HostFacts leaves it out; fitness_baseline.drift_of reads it), and an answer cut before it
# lacks @@os and @@end too.
REQUIRED_SECTIONS = tuple(name for name in FACTS_SECTIONS if name != "baseline")


@dataclass
class HostFacts:
    gpus: list[Gpu]
    driver_version: str
    cuda_driver_version: str
    interconnect: str
    toolkit_version: Optional[str]
    os: str
    kernel: str
    problems: list[str] = field(default_factory=list)
    # Power, clocks, PCIe link, ECC, NCCL, IOMMU (core/fitness.py); None in a state written before.
    fitness: Optional[HostFitness] = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HostFacts":
        """Back from `as_dict` (Pulumi state drops null values, so every field has a default)."""
        return cls(gpus=[Gpu(**g) for g in d.get("gpus") or []], driver_version=d.get("driver_version", ""),
                   cuda_driver_version=d.get("cuda_driver_version", ""), interconnect=d.get("interconnect", "unknown"),
                   toolkit_version=d.get("toolkit_version"), os=d.get("os", ""), kernel=d.get("kernel", ""),
                   problems=list(d.get("problems") or []), fitness=HostFitness.from_dict(d.get("fitness")))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpu_count"] = len(self.gpus)
        d["gpu_memory_mib"] = min((g.memory_mib for g in self.gpus), default=0)
        d["gpu_models"] = sorted({g.name for g in self.gpus})
        return d


def split_sections(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@") and not line.startswith("@@rc="):
            current = line[2:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def _cut_short(text: str, missing: list[str]) -> FactError:
    tail = text.rstrip()[-120:]
    return FactError(f"the host-facts answer was cut short: it ends before its section(s) {', '.join(missing)} "
                     f"({len(text)} characters, last: {tail!r}); nothing was taken from it. Run the command again; "
                     "if it keeps happening, check the host's sshd journal for dropped connections")


def parse_facts(text: str) -> HostFacts:
    """The answer of `FACTS_SCRIPT`. Raises `FactError` when it is not whole (a section or the
    final @@end missing): a cut-short answer is never read as a host without GPUs."""
    s = split_sections(text)
    missing = [name for name in REQUIRED_SECTIONS if name not in s]
    if missing:
        raise _cut_short(text, missing)
    problems = []
    query = s["query"]
    failed = re.search(r"^@@rc=([0-9]+)", query, re.M)
    said = query[:failed.start()].strip() if failed else query.strip()
    gpus = [] if failed else parse_query_gpu(query)
    if not gpus:
        # What nvidia-smi itself said (its stderr is in the section: 2>&1) and its exit code.
        problems.append(f"nvidia-smi lists no GPUs on the host: `{' '.join(GPU_QUERY)}` exited "
                        f"{failed.group(1) if failed else 0}: {said[:300] or '(no output)'}")
    header = parse_smi_header(s.get("smi", ""))
    try:
        topo = parse_topo(s.get("topo", "")) if gpus else {"interconnect": "unknown"}
    except FactError as exc:
        problems.append(str(exc))
        topo = {"interconnect": "unknown"}
    nvcc = s.get("nvcc", "")
    osr = parse_os_release(s.get("os", ""))
    return HostFacts(
        gpus=gpus,
        driver_version=header.get("driver_version", gpus[0].driver_version if gpus else ""),
        cuda_driver_version=header.get("cuda_version", ""),
        interconnect=str(topo["interconnect"]),
        toolkit_version=None if "@@rc=" in nvcc else parse_nvcc(nvcc),
        os=osr.get("PRETTY_NAME", ""),
        kernel=s.get("kernel", "").strip(),
        problems=problems,
        fitness=parse_fitness(s.get("fitness", ""), s.get("nccl", ""), s.get("iommu", "")) if gpus else None,
    )


def check_facts(facts: HostFacts, *, gpu_count: int, gpu_memory_gb: float, interconnect: str,
                needed_gpus: int) -> list[str]:
    """Differences between what the stack declares and what the host has, as sentences that
    say what to change. Empty when the host can run the strategy. `needed_gpus` 0: a machine that
    runs no strategy (the router's own, gpu-serving:router.host): its GPUs, driver and CUDA, or
    their absence, are none of its business, so nothing is expected of them."""
    if needed_gpus == 0:
        return []
    out = list(facts.problems)
    have = len(facts.gpus)
    if have == 0:
        # Never "use world size 0": the host has a GPU problem, not a smaller layout.
        if not any("no GPUs" in p for p in out):
            out.append(f"the strategy needs {needed_gpus} GPUs but nvidia-smi lists none on the host; "
                       "check the driver with `nvidia-smi` there")
    elif have < needed_gpus:
        out.append(f"the strategy needs {needed_gpus} GPUs but the host has {have}; use a layout with world size {have} or another host")
    elif have != gpu_count:
        out.append(f"host.gpuCount says {gpu_count} but the host has {have} GPUs; set gpuCount: {have}")
    if facts.gpus:
        smallest = min(g.memory_mib for g in facts.gpus) / 1024
        # Vendors round: a "96 GB" card reports 95.6 GiB. More than 5% short is another card.
        if smallest < gpu_memory_gb * 0.95:
            out.append(f"host.gpuMemoryGb says {gpu_memory_gb:g} GB but the host's GPUs have {smallest:.1f} GB; "
                       f"set gpuMemoryGb: {int(smallest)} (the memory plan depends on it)")
    if facts.gpus and interconnect == "nvlink" and facts.interconnect not in ("nvlink", "single"):
        out.append(f"host.interconnect says nvlink but nvidia-smi topo -m shows {facts.interconnect}; set interconnect: pcie")
    return out
