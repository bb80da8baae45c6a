"""How fast the rehearsal engine streams tokens: a small, documented performance model per layout.

The parameters live in performance.json beside this file. They are FITTED to the founding
scenario's four measurements (Kimi K2.6 on 8 x RTX PRO 6000, PCIe: TP8 26 tok/s at one request
and 808 at 32; PP8 37 at one and 396 at 64), not derived from hardware; the NVLink values, the
EP all-to-all and the DP-attention terms have no measurement behind them. A rehearsal figure is
never a GPU measurement.

The model (times in ms; L = the model's layers; g = tp; b = requests decoding at once):

- a pipeline stage holds ceil(L / pp) layers (the fullest stage paces the pipeline);
- one decode step of a stage for a micro-batch of m requests:
  ``stage(m) = Ls * (layer/g + layer_seq * m' / g + comm(m)) + hop(m)`` where
  m' = m / dp under DP attention (attention runs per DP rank), else m;
  ``comm(m) = ring(g) * (allreduce + allreduce_seq * m)`` with ring(g) = 2 (g - 1) / g (0 when
  g = 1); with an all-to-all MoE backend the MoE half of the all-reduce becomes
  ``all_to_all + all_to_all_seq * m``; ``hop(m) = hop + hop_seq * m`` when pp > 1 (PP hands every
  request's state to the next stage: in the seed's figures that per-request cost is what caps PP8
  at high concurrency);
- the requests split into M = min(b, pp) micro-batches of m = b / M; every request gets one token
  per round, ``round(b) = max(M, pp) * stage(m)`` (fewer micro-batches than stages leave a bubble);
- per-stream rate = 1000 / round(b) tok/s, output throughput = b * 1000 / round(b);
- prefill of n input tokens: ``L * n * prefill_token_layer / g + L * ring(g) * allreduce +
  (pp - 1) * hop`` (every layer sees the whole prompt; PP stages run one after another).

Multi-node (nnodes > 1; performance.json "cross_node", assumptions): a TP group that spans nodes
(more nodes than PP stages) runs its all-reduce / all-to-all at the cross-node link's figures (a
ring is paced by its slowest link); with PP over nodes, a stage hop pays the cross-node hop_ms
(the per-request hop_seq cost stays the node's). The link is InfiniBand unless NCCL_IB_DISABLE
is set (then NCCL's TCP sockets). TP16 over two PCIe nodes on InfiniBand streams about 19 tok/s
at one request (TP8 on one node: 26): spanning nodes is for fitting a model, not for speed.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

PARAMETERS = Path(__file__).with_name("performance.json")
INTERCONNECTS = ("pcie", "nvlink")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    dp_attention: bool = False
    all_to_all: bool = False        # moe_a2a_backend other than "none"
    interconnect: str = "pcie"
    nnodes: int = 1
    cross_node: str = "infiniband"  # the link between nodes when nnodes > 1

    @classmethod
    def from_args(cls, args, interconnect: str, cross_node: str = "infiniband") -> "Layout":
        """From the engine's resolved server args."""
        backend = getattr(args, "moe_a2a_backend", None) or "none"
        return cls(tp=int(args.tp_size), pp=int(args.pp_size), ep=int(getattr(args, "ep_size", 1) or 1),
                   dp=int(getattr(args, "dp_size", 1) or 1),
                   dp_attention=bool(getattr(args, "enable_dp_attention", False)),
                   all_to_all=backend != "none", interconnect=interconnect,
                   nnodes=int(getattr(args, "nnodes", 1) or 1), cross_node=cross_node)

    @property
    def tp_spans_nodes(self) -> bool:
        """SGLang gives PP stages to nodes first; a TP group spans nodes when nodes outnumber stages."""
        return self.nnodes > 1 and self.nnodes // self.pp > 1


def ring(g: int) -> float:
    return 2.0 * (g - 1) / g if g > 1 else 0.0


class PerformanceModel:
    def __init__(self, params: dict):
        self.params = params
        self.decode = params["decode"]
        self.prefill = params["prefill"]
        self.links = params["interconnect"]
        self.cross_links = {k: v for k, v in params.get("cross_node", {}).items() if isinstance(v, dict)}

    @classmethod
    def load(cls, path: Path = PARAMETERS) -> "PerformanceModel":
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    def _link(self, layout: Layout) -> dict:
        if layout.interconnect not in self.links:
            raise ValueError(f"interconnect {layout.interconnect!r}: the model knows {sorted(self.links)}")
        return self.links[layout.interconnect]

    def _cross(self, layout: Layout) -> dict:
        if layout.cross_node not in self.cross_links:
            raise ValueError(f"cross-node link {layout.cross_node!r}: the model knows {sorted(self.cross_links)}")
        return self.cross_links[layout.cross_node]

    def _tp_link(self, layout: Layout) -> dict:
        return self._cross(layout) if layout.tp_spans_nodes else self._link(layout)

    def _hop_ms(self, layout: Layout) -> float:
        return (self._cross(layout) if layout.nnodes > 1 else self._link(layout))["hop_ms"]

    def stage_ms(self, layout: Layout, layers: int, m: float) -> float:
        link = self._link(layout)
        tp_link = self._tp_link(layout)
        g = layout.tp
        per_stage = math.ceil(layers / layout.pp)
        m_attn = m / layout.dp if layout.dp_attention else m
        allreduce = ring(g) * (tp_link["allreduce_ms"] + tp_link["allreduce_seq_ms"] * m)
        if layout.all_to_all and layout.ep > 1:
            comm = allreduce / 2 + tp_link["all_to_all_ms"] + tp_link["all_to_all_seq_ms"] * m
        else:
            comm = allreduce
        step = per_stage * (self.decode["layer_ms"] / g + self.decode["layer_seq_ms"] * m_attn / g + comm)
        if layout.pp > 1:
            step += self._hop_ms(layout) + link["hop_seq_ms"] * m
        return step

    def round_ms(self, layout: Layout, layers: int, running: int) -> float:
        """Time in which every running request gets one more token."""
        b = max(1, running)
        micro = min(b, layout.pp)
        return max(micro, layout.pp) * self.stage_ms(layout, layers, b / micro)

    def stream_tok_s(self, layout: Layout, layers: int, running: int) -> float:
        return 1000.0 / self.round_ms(layout, layers, running)

    def output_tok_s(self, layout: Layout, layers: int, concurrency: int) -> float:
        return max(1, concurrency) * self.stream_tok_s(layout, layers, concurrency)

    def prefill_ms(self, layout: Layout, layers: int, input_tokens: int) -> float:
        g = layout.tp
        ms = layers * input_tokens * self.prefill["token_layer_ms"] / g + layers * ring(g) * self._tp_link(layout)["allreduce_ms"]
        return ms + (layout.pp - 1) * self._hop_ms(layout)


def interconnect_from_topology(topo_text: str, gpu_indices) -> str:
    """"nvlink" when every pair of the given GPUs shows an NV# link in ``nvidia-smi topo -m``,
    else "pcie" (also when the matrix cannot be read)."""
    gpu_indices = list(gpu_indices)
    if len(gpu_indices) < 2:
        return "pcie"
    return "pcie" if pair_without_nvlink(topo_text, gpu_indices) else "nvlink"


def pair_without_nvlink(topo_text: str, gpu_indices) -> tuple[int, int] | None:
    """The first pair of the given GPUs that ``nvidia-smi topo -m`` shows without an NV# link
    (the first two when the matrix cannot be read), or None when every pair has one."""
    indices = list(gpu_indices)
    wanted = {f"GPU{i}" for i in indices}
    rows = {}
    header = None
    for line in re.sub(r"\x1b\[[0-9;]*m", "", topo_text).splitlines():  # the header is underlined
        cells = line.split()
        if not cells:
            continue
        if header is None and cells[0].startswith("GPU"):
            header = [c for c in cells if c.startswith("GPU")]
            continue
        if header and cells[0] in wanted:
            rows[cells[0]] = dict(zip(header, cells[1:1 + len(header)]))
    if len(indices) < 2:
        return None
    if set(rows) != wanted:
        return indices[0], indices[1]
    for i, a in enumerate(indices):
        for b in indices[i + 1:]:
            if not rows[f"GPU{a}"].get(f"GPU{b}", "").startswith("NV"):
                return a, b
    return None
