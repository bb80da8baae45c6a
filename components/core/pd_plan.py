"""The plan of a prefill/decode stack (gpu-serving:disaggregation), from its servers' plans. Pure.

`plan.build_plans` plans every server like any host of a fleet (`StackSettings.per_host` gives
each its role's layout and RolePlace, so the unit renderer writes the role's flags); this module
adds what only the pair has:

- the KV path: how many bytes a token's KV cache is on the wire, what the link between the hosts
  carries a second, what a prompt's transfer takes; a warning with those numbers when it is
  plain TCP;
- what bounds concurrency: the decode servers hold every running request's KV cache (prompt and
  output) for the whole decode, the prefill servers only while a prompt is prefilled and sent;
- the router's unit in PD mode (smg `--pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL`,
  read from the pinned smg 1.13.0's `smg launch --help`).

The wire size: SGLang's MLA backends keep the latent KV whole on every attention-TP rank, and a
decode attention rank takes its own copy from a prefill rank (disaggregation/common/conn.py
`_resolve_rank_mapping`: equal tp sizes pair the ranks; a smaller decode attention group reads
from one prefill rank), so the bytes that cross are the per-token KV times the decode side's
attention-TP size; DP attention on decode (attention TP 1 a rank) sends one copy. A non-MLA
model's heads are split over the ranks: one copy in all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence

from . import router as R
from .errors import ConfigError, SettingError
from .pd_settings import WHERE, Disaggregation
from .rules import NAMESPACE
from .strategy import Layout, layout_of

if TYPE_CHECKING:
    from .config import StackSettings
    from .memory import MemoryPlan
    from .unit import RenderedUnit

# What a Gbit/s is in bytes a second.
GBIT = 1e9 / 8


class ServerPlan(Protocol):
    """What the pair's plan reads of a server's plan.ServingPlan (plan.py imports this module)."""

    @property
    def settings(self) -> StackSettings: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def memory(self) -> MemoryPlan: ...
    @property
    def unit(self) -> RenderedUnit: ...
    @property
    def world_size(self) -> int: ...


@dataclass(frozen=True)
class Server:
    role: str
    host: str          # the gpu-serving:hosts entry
    plan: ServerPlan   # its plan.ServingPlan
    url: str           # where the router reaches it


@dataclass(frozen=True)
class KvPath:
    bytes_per_token: int        # the model's KV cache a token, every layer
    copies: int                 # copies that cross (decode attention ranks for MLA)
    network: str
    link_gbps: float
    backend: str

    @property
    def wire_bytes_per_token(self) -> int:
        return self.bytes_per_token * self.copies

    @property
    def tokens_per_second(self) -> float:
        """Tokens of KV the link carries a second at line rate."""
        return self.link_gbps * GBIT / self.wire_bytes_per_token

    def seconds(self, tokens: int) -> float:
        return tokens / self.tokens_per_second

    def as_dict(self) -> dict[str, Any]:
        return {"bytes_per_token": self.bytes_per_token, "copies": self.copies,
                "wire_bytes_per_token": self.wire_bytes_per_token, "network": self.network, "link_gbps": self.link_gbps,
                "transfer_backend": self.backend, "tokens_per_second": round(self.tokens_per_second)}


@dataclass(frozen=True)
class PdPlan:
    servers: list[Server]
    kv: KvPath
    decode_kv_tokens: int           # the decode servers' KV room, every DP rank and server
    prefill_kv_tokens: int
    requests_at_context: int        # whole-context requests the decode side holds at once
    requests_at_workload: int       # requests of the benchmark's input + output length
    running_cap: int                # maxRunningRequests over the decode servers
    router_exec_start: list[str]
    router_unit: str
    warnings: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"servers": [{"role": s.role, "host": s.host, "url": s.url, "unit_name": s.plan.unit.name,
                             "layout": s.plan.layout.describe(), "world_size": s.plan.world_size,
                             "max_total_tokens": s.plan.memory.max_total_tokens} for s in self.servers],
                "kv_path": self.kv.as_dict(), "decode_kv_tokens": self.decode_kv_tokens,
                "prefill_kv_tokens": self.prefill_kv_tokens, "requests_at_context": self.requests_at_context,
                "requests_at_workload": self.requests_at_workload, "running_cap": self.running_cap,
                "router_exec_start": self.router_exec_start, "router_unit": self.router_unit,
                "warnings": self.warnings, "summary": self.lines}


def server_url(settings: StackSettings, addresses: Optional[dict[str, str]] = None) -> str:
    """How the router reaches a server: its address, a running rehearsal host's, or a stand-in."""
    h = settings.host
    address = h.address or (addresses or {}).get(h.rehearsal) or f"rehearsal-{h.rehearsal}"
    return R.worker_url(address, settings.serving.port)


def _disaggregation_of(settings: StackSettings) -> Disaggregation:
    """The checked gpu-serving:disaggregation of a PD stack (only such a stack has a pair's plan)."""
    if settings.disaggregation is None:
        raise ValueError(f"stack {settings.stack} declares no gpu-serving:disaggregation")
    return settings.disaggregation


def kv_path(settings: StackSettings) -> KvPath:
    """The KV path of a PD stack (`settings`: the stack's StackSettings)."""
    d = _disaggregation_of(settings)
    m = settings.model
    if m.is_mla:
        per_token = (m.kv_lora_rank + m.qk_rope_head_dim) * m.num_layers * m.kv_dtype_bytes
    else:
        per_token = (m.kv_bytes_per_token_per_layer or 0) * m.num_layers
    decode = d.layouts["decode"]
    attn_tp = decode.tp_size // decode.dp_size if decode.enable_dp_attention and decode.dp_size > 1 else decode.tp_size
    copies = attn_tp if m.is_mla else 1
    s = d.settings
    return KvPath(int(round(per_token)), max(copies, 1), s.network, s.link_gbps, s.transfer_backend)


def build(settings: StackSettings, plans: Sequence[tuple[str, ServerPlan]], addresses: Optional[dict[str, str]] = None) -> PdPlan:
    """The pair's plan from its servers' plans (`plans`: build_plans' (host, ServingPlan), in
    `per_host` order); raises ConfigError for what the pair cannot do."""
    d = _disaggregation_of(settings)
    roles = dict((name, role) for role, name in d.roles())
    servers = [Server(roles[name], name, plan, server_url(plan.settings, addresses)) for name, plan in plans]
    errors: list[SettingError] = []
    kv = kv_path(settings)
    if kv.bytes_per_token <= 0:
        errors.append(SettingError(f"{NAMESPACE}:model.kvBytesPerTokenPerLayer", "the model's KV cache a token is unknown: "
                                   "the decode server's transfer cannot be sized", "set kvBytesPerTokenPerLayer"))
    if errors:
        raise ConfigError(errors, f"stack {settings.stack}")

    def room(role: str) -> int:
        return sum(s.plan.memory.max_total_tokens * layout_of(s.plan.settings).dp_size for s in servers if s.role == role)

    decode_tokens, prefill_tokens = room("decode"), room("prefill")
    context = settings.serving.context_length
    b = settings.benchmark
    workload = b.input_len + b.output_len
    running = sum(s.plan.memory.max_running_requests for s in servers if s.role == "decode")
    prefill = [(s.url, d.settings.bootstrap_port) for s in servers if s.role == "prefill"]
    decode = [s.url for s in servers if s.role == "decode"]
    argv = R.exec_start(settings, [], pd=(prefill, decode))
    unit = R.render_unit(settings, [], pd=(prefill, decode))
    warnings = []
    if kv.network == "tcp":
        warnings.append(tcp_warning(settings, kv, workload_input=b.input_len))
    lines = [
        f"KV path      {kv.backend} over {kv.network} at {kv.link_gbps:g} Gbit/s: {kv.bytes_per_token:,} B a token x "
        f"{kv.copies} cop{'y' if kv.copies == 1 else 'ies'} = {kv.wire_bytes_per_token:,} B on the wire; "
        f"{kv.tokens_per_second:,.0f} tokens/s at line rate ({_seconds(kv.seconds(b.input_len))} for a "
        f"{b.input_len}-token prompt, {_seconds(kv.seconds(context))} for {context})",
        f"concurrency  the decode side's KV room ({decode_tokens:,} tokens over {len(decode)} server(s)) holds "
        f"{decode_tokens // max(context, 1):,} request(s) at contextLength {context} or "
        f"{decode_tokens // max(workload, 1):,} of the benchmark's {b.input_len}+{b.output_len} tokens; "
        f"maxRunningRequests caps it at {running}; the prefill side ({prefill_tokens:,} tokens) holds a prompt only "
        "while it is prefilled and sent",
    ]
    return PdPlan(servers, kv, decode_tokens, prefill_tokens, decode_tokens // max(context, 1),
                  decode_tokens // max(workload, 1), running, argv, unit, warnings, lines)


def tcp_warning(settings: StackSettings, kv: KvPath, workload_input: int) -> str:
    context = settings.serving.context_length
    why = ("one a decode attention rank; DP attention on decode sends one, where its memory allows" if kv.copies > 1 else
           "DP attention on decode: one copy")
    return (f"{WHERE}.network: the KV cache crosses plain TCP at {kv.link_gbps:g} Gbit/s "
            f"({kv.link_gbps * GBIT / 1e9:.2f} GB/s): {settings.model.name}'s {kv.bytes_per_token:,} B a token x "
            f"{kv.copies} ({why}) = {kv.wire_bytes_per_token:,} B, so the link carries at most "
            f"{kv.tokens_per_second:,.0f} tokens a second: a {workload_input}-token prompt's KV takes "
            f"{_seconds(kv.seconds(workload_input))} before its first token, a {context}-token one "
            f"{_seconds(kv.seconds(context))} (line rate; Mooncake over TCP reaches less). RDMA: network infiniband "
            "or roce, with ibDevices")


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"
