"""The SGLang flags gpu-serving writes: one table, read by everything that deals with them.

Each row says which flag ExecStart carries, from which setting, how it is written, and which
other spellings SGLang accepts for it. From this table alone:

- `unit.exec_start` writes the flags, in the table's order (components/core/unit.py);
- `strategy.check_extra_args` refuses a flag of the table (or another spelling of it) in
  `serving.extraArgs`: written twice, the later one would silently win over the setting;
- `config.ServingSettings` declares the serving settings that are nothing but a flag (a row with
  a `declare`: the setting's type and default live here, not in config.py);
- docs/flags.md is generated (`markdown()`; tests/test_flags.py checks the file is current).

Add a flag: one row here, one case under tests/data/flags/ (docs/flags.md says how).
Settings with a meaning beyond their flag (model.path, the layout, serving.host and .port, which
readiness and the switch use too) are declared in config.py; their rows only say how to write them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional


# Written as `--flag value`; left out when the setting's value is `omit`.
VALUE = "value"
# Written as `--flag` alone when the setting is true.
SWITCH = "switch"
# Never written; refused in extraArgs with the row's `about`.
REFUSED = "refused"
# Written from the server's place (`place`: settings.node in a multi-node layout, settings.role
# in a prefill/decode stack; `derive` reads it and may say None: not written), only there;
# refused in extraArgs (set the setting the row names).
DERIVED = "derived"

# SGLang's choices (server_args.py), checked before anything touches a host.
ATTENTION_BACKENDS = (
    "triton", "torch_native", "flex_attention", "fa3", "fa4", "flashinfer", "flashmla",
    "cutlass_mla", "trtllm_mla", "cutedsl_mla", "trtllm_mha", "aiter",
)
GRAMMAR_BACKENDS = ("xgrammar", "outlines", "llguidance", "none")
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


@dataclass(frozen=True)
class Flag:
    """One flag of ExecStart.

    flag: SGLang's canonical spelling, the one written; aliases: the other spellings its parser
    accepts for the same argument (refused in extraArgs like the flag itself); setting: where the
    value comes from, `section.camelKey` (None for a REFUSED row); form: VALUE, SWITCH or REFUSED;
    omit: the value for which a VALUE flag is left out; text: how a value is written (default
    str); declare: (type, default) or (type, default, bounds of pydantic's Field) when this table
    declares the setting (a serving setting that is only this flag); about: one line for docs/flags.md (for REFUSED: why);
    when: for a SWITCH, a further condition on the stack's settings (when_about says it in words)."""

    flag: str
    setting: Optional[str]
    about: str
    form: str = VALUE
    aliases: tuple[str, ...] = ()
    omit: Any = None
    text: Callable[[Any], str] = str
    declare: Optional[tuple[Any, ...]] = None
    derive: Optional[Callable[[Any], Any]] = None
    # A SWITCH written only when its setting is true and this holds of the whole stack's settings.
    when: Optional[Callable[[Any], bool]] = None
    when_about: str = ""
    place: str = "node"

    @property
    def section(self) -> str:
        return (self.setting or "").split(".", 1)[0]

    @property
    def key(self) -> str:
        """The camelCase key in its section (`cudaGraphMaxBs`)."""
        return (self.setting or "").split(".", 1)[-1]

    @property
    def attribute(self) -> str:
        """The settings object's attribute (`cuda_graph_max_bs`)."""
        return "".join("_" + c.lower() if c.isupper() else c for c in self.key)

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)


_MULTI_NODE = "set strategy.nodes (docs/multi-node.md)"

# In ExecStart order (after the interpreter and `-m sglang.launch_server`; serving.extraArgs last).
FLAGS: tuple[Flag, ...] = (
    Flag("--model-path", "model.path", "where the weights are", aliases=("--model",)),
    Flag("--served-model-name", "model.servedName", "the model name the API answers to"),
    Flag("--tp-size", "strategy.tpSize", "tensor-parallel size", aliases=("--tensor-parallel-size", "--tp")),
    Flag("--pp-size", "strategy.ppSize", "pipeline-parallel size", aliases=("--pipeline-parallel-size",)),
    Flag("--ep-size", "strategy.epSize", "expert-parallel size (inside the TP group)",
         aliases=("--expert-parallel-size", "--ep")),
    Flag("--dp-size", "strategy.dpSize", "data-parallel size", aliases=("--data-parallel-size", "--dp")),
    Flag("--enable-dp-attention", "strategy.enableDpAttention", "attention data-parallel inside the TP group",
         form=SWITCH),
    Flag("--moe-a2a-backend", "strategy.moeA2aBackend", "MoE all-to-all backend", omit="none"),
    Flag("--mem-fraction-static", "serving.memFractionStatic", "weights + KV cache pool, as a share of GPU memory",
         text=lambda v: f"{v:g}", declare=(float, 0.88, dict(gt=0, lt=1))),
    Flag("--context-length", "serving.contextLength", "longest context a request may have",
         declare=(int, 32768, dict(ge=1, le=10_000_000))),
    Flag("--max-running-requests", "serving.maxRunningRequests", "requests decoded at once (null: SGLang's default)",
         declare=(Optional[int], 64, dict(ge=1, le=100_000))),
    Flag("--attention-backend", "serving.attentionBackend", "attention kernels",
         declare=(Optional[Literal[ATTENTION_BACKENDS]], "triton")),
    Flag("--grammar-backend", "serving.grammarBackend", "structured-output backend",
         declare=(Optional[Literal[GRAMMAR_BACKENDS]], "none")),
    Flag("--trust-remote-code", "serving.trustRemoteCode", "run the model repository's own code", form=SWITCH,
         declare=(bool, True)),
    Flag("--speculative-algorithm", "serving.speculativeAlgorithm", "speculative decoding (not with ppSize > 1)",
         declare=(Optional[Literal[SPECULATIVE_ALGORITHMS]], None)),
    # SGLang renamed --cuda-graph-max-bs to --cuda-graph-max-bs-decode (mid-2026) and keeps the
    # old spelling as a deprecated alias: the canonical one is written, the name users know is the setting.
    Flag("--cuda-graph-max-bs-decode", "serving.cudaGraphMaxBs",
         "largest decode batch captured in a CUDA graph (fewer: less memory, slower large batches)",
         aliases=("--cuda-graph-max-bs",), declare=(Optional[int], None, dict(ge=1, le=100_000))),
    Flag("--host", "serving.host", "address the server binds"),
    Flag("--port", "serving.port", "port the server listens on"),
    # On by default: `watch`, the recommendation and a Prometheus read the servers' load from here.
    Flag("--enable-metrics", "serving.enableMetrics", "SGLang's Prometheus metrics on /metrics of the serving port",
         form=SWITCH, declare=(bool, True)),
    # SGLang's own advice under DP attention: every scheduler reports, so each DP rank's load is seen
    # (components/core/traffic.py counts one series per DP rank and stage).
    Flag("--enable-metrics-for-all-schedulers", "serving.enableMetrics", "every scheduler (each TP rank) reports metrics",
         form=SWITCH, when=lambda s: bool(s.strategy.enable_dp_attention), when_about="under strategy.enableDpAttention"),
    # Off by default: a new flag in ExecStart restarts every serving model once on upgrade. On, the
    # watch reads each request's lengths as a distribution (p50, p90), not only the tick's means.
    Flag("--collect-tokens-histogram", "serving.collectTokensHistogram",
         "SGLang's prompt and generation length histograms on /metrics (the watch's length distribution)",
         form=SWITCH, declare=(bool, False), when=lambda s: bool(s.serving.enable_metrics),
         when_about="with serving.enableMetrics"),
    Flag("--nnodes", "strategy.nodes", "how many nodes the layout spans (multi-node only)", form=DERIVED,
         derive=lambda node: node.nnodes),
    Flag("--node-rank", "strategy.nodes", "this node's rank: its place in strategy.nodes", form=DERIVED,
         derive=lambda node: node.rank),
    Flag("--dist-init-addr", "strategy.distInitPort", "rank 0's address and the rendezvous port", form=DERIVED,
         aliases=("--nccl-init-addr",), derive=lambda node: node.dist_init_addr),
    # Prefill/decode disaggregation (pd_settings.py): the server's role and the KV transfer.
    Flag("--disaggregation-mode", "disaggregation.prefill", "the server's role, prefill or decode (the role naming its host)",
         form=DERIVED, place="role", derive=lambda role: role.role),
    Flag("--disaggregation-transfer-backend", "disaggregation.transferBackend", "the KV cache's transfer backend",
         form=DERIVED, place="role", derive=lambda role: role.transfer_backend),
    Flag("--disaggregation-bootstrap-port", "disaggregation.bootstrapPort",
         "the prefill server's bootstrap server (prefill only)", form=DERIVED, place="role",
         derive=lambda role: role.bootstrap_port),
    Flag("--disaggregation-ib-device", "disaggregation.ibDevices", "the RDMA devices of the transfer (when set)",
         form=DERIVED, place="role", derive=lambda role: role.ib_device),
    Flag("--disaggregation-decode-tp", "disaggregation.decode", "the decode side's tp size, on the prefill server when "
         "it differs from the prefill's", form=DERIVED, place="role", derive=lambda role: role.decode_tp),
    Flag("--disaggregation-decode-dp", "disaggregation.decode", "the decode side's dp size, on the prefill server when "
         "it differs from the prefill's", form=DERIVED, place="role", derive=lambda role: role.decode_dp),
)


def owned() -> dict[str, str]:
    """Every spelling of a flag gpu-serving writes or refuses -> the setting to use instead, or,
    in parentheses, why it cannot be given (strategy.check_extra_args)."""
    return {spelling: (row.setting or "" if row.form != REFUSED else f"({row.about})")
            for row in FLAGS for spelling in row.spellings}


def declared(section: str) -> dict[str, tuple[Any, Any]]:
    """The settings of `section` this table declares: attribute -> (type, default or Field), in
    the table's order (config.ServingSettings)."""
    # Imported here: the provider's process imports this table (unit rendering) and never pydantic.
    from pydantic import Field

    return {row.attribute: (row.declare[0], Field(row.declare[1], **row.declare[2]) if len(row.declare) > 2 else row.declare[1])
            for row in FLAGS if row.declare is not None and row.section == section}


def words(settings: Any, namespace: str) -> list[tuple[str, str]]:
    """ExecStart's flags for `settings` (a StackSettings), each word with the setting it comes
    from (`namespace:section.key`, named in a refusal by the rendering guard)."""
    out: list[tuple[str, str]] = []
    for row in FLAGS:
        if row.form == REFUSED:
            continue
        where = f"{namespace}:{row.setting}"
        if row.form == DERIVED:
            place = getattr(settings, row.place, None)
            value = row.derive(place) if place is not None and row.derive is not None else None
            if value is not None:
                out += [(where, row.flag), (where, str(value))]
            continue
        value = getattr(getattr(settings, row.section), row.attribute)
        if row.form == SWITCH:
            if value and (row.when is None or row.when(settings)):
                out.append((where, row.flag))
        elif value is not None and value != row.omit:
            out += [(where, row.flag), (where, row.text(value))]
    return out


def markdown(sections: dict[str, Any]) -> str:
    """docs/flags.md: the table, as users read it; `sections`: config.SECTIONS (the defaults)."""
    lines = [
        "# SGLang flags gpu-serving writes",
        "",
        "Generated from `components/core/flags.py` (tests/test_flags.py fails when this file is",
        "not current; regenerate with `UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_flags.py`).",
        "Each flag comes from one setting, in this order, after `python -m sglang.launch_server`;",
        "`serving.extraArgs` follow. A flag of this table (in any spelling SGLang accepts) is refused in",
        "`serving.extraArgs`: set the setting instead.",
        "",
        "| flag | setting | default | written | also refused in extraArgs | what |",
        "|---|---|---|---|---|---|",
    ]
    for row in FLAGS:
        if row.form in (REFUSED, DERIVED):
            continue
        field = sections[row.section].model_fields[row.attribute]
        default = field.get_default(call_default_factory=True)
        if default is None:
            # A None the table declares leaves the flag out; config.py derives its own (model.path).
            default = "(not written)" if row.declare is not None else "(derived: docs/configuration.md)"
        default = str(default).lower() if isinstance(default, bool) else str(default)
        written = {VALUE: "`--flag value`", SWITCH: "`--flag` when true"}[row.form]
        if row.when_about:
            written += f", {row.when_about}"
        if row.form == VALUE and row.omit is not None:
            written += f", not when {row.omit}"
        aliases = ", ".join(f"`{a}`" for a in row.aliases)
        lines.append(f"| `{row.flag}` | `{row.setting}` | {default} | {written} | {aliases} | {row.about} |")
    derived = [row for row in FLAGS if row.form == DERIVED and row.place == "node"]
    lines += ["", "Written on a multi-node layout only (`strategy.nodes` or `strategy.nnodes`), from the node's place "
              "in it; refused in `serving.extraArgs`: "
              + ", ".join(f"`{row.flag}` ({row.about}; `{row.setting}`)" for row in derived) + "."]
    roles = [row for row in FLAGS if row.form == DERIVED and row.place == "role"]
    lines += ["", "Written on a prefill/decode stack only (`gpu-serving:disaggregation`, docs/pd.md), from "
              "the server's role; refused in `serving.extraArgs`: "
              + ", ".join(f"`{row.flag}` ({row.about}; `{row.setting}`)" for row in roles) + "."]
    refused = [row for row in FLAGS if row.form == REFUSED]
    if refused:
        lines += ["", "Never written, refused in `serving.extraArgs`: "
                  + ", ".join(f"`{row.flag}` ({row.about})" for row in refused) + "."]
    lines += ["",
              "## Add a flag",
              "",
              "1. One row in `FLAGS` (components/core/flags.py): the flag, its setting, how it is written,",
              "   the other spellings SGLang accepts; for a serving setting that is only this flag, its",
              "   type and default (`declare`).",
              "2. One case, `tests/data/flags/<name>.json`: the settings that set it, and the refusals",
              "   it brings (a bad value, the flag given in extraArgs).",
              "3. `UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_flags.py` writes the case's unit",
              "   (`tests/data/flags/<name>.service`, review it) and this page.",
              ""]
    return "\n".join(lines)
