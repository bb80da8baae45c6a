"""SGLang's parallelism rules, checked before anything touches a host.

The rules follow SGLang's own code (notes/sglang.md): server_args.py decides the world size
and rewrites some sizes, parallel_state.py refuses a world size that does not match, FusedMoE
asserts the expert split. Where SGLang silently rewrites a setting (dp_size 1 turning DP
attention off, an all-to-all backend overwriting ep_size) we refuse instead: the unit must run
exactly the layout the stack file declares, or readiness could never confirm it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from . import flags
from .config import A2A_BACKENDS, NAMESPACE, StackSettings
from .errors import SettingError, shown
from .layout_words import layout_text
from .unit import unit_name

S = f"{NAMESPACE}:strategy"
SERVING = f"{NAMESPACE}:serving"

# All-to-all backends whose kernels need NVLink between the GPUs of a node: DeepEP's normal
# (intranode) mode, which SGLang's `auto` mode runs for prefill, checks NVLink between every pair
# of the EP group (deep_ep/utils.py check_nvlink_connections) and moves tokens over it.
NVLINK_A2A = ("deepep",)

# Flags SGLang's newest parser rejects (the old MoE switches) and what replaces them.
DEPRECATED_FLAGS = {
    "--enable-ep-moe": "set strategy.epSize instead",
    "--enable-deepep-moe": "set strategy.moeA2aBackend: deepep instead",
}
# Prefixes that argparse cannot resolve to one flag (--pp matches --pp-size, --pp-max-micro-batch-size, ...).
AMBIGUOUS_FLAGS = {"--pp": "--pp-size (strategy.ppSize)"}
# Flags gpu-serving writes itself from a setting (in every spelling SGLang accepts), or refuses
# (multi-node): giving them in extraArgs would write a flag twice and hide the declared layout.
# From the flag table (flags.py).
OWNED_FLAGS = flags.owned()


@dataclass(frozen=True)
class Layout:
    """The layout SGLang will resolve from the declared sizes."""

    tp_size: int
    pp_size: int
    ep_size: int
    dp_size: int
    enable_dp_attention: bool
    moe_a2a_backend: str
    nnodes: int = 1

    @property
    def world_size(self) -> int:
        # compute_world_size: DP attention splits attention inside the TP group, so it adds no
        # GPUs; plain DP runs dp_size full replicas.
        return (1 if self.enable_dp_attention else self.dp_size) * self.tp_size * self.pp_size

    @property
    def moe_tp_size(self) -> int:
        return self.tp_size // self.ep_size if self.ep_size and self.tp_size % self.ep_size == 0 else 0

    @property
    def attn_tp_size(self) -> int:
        if self.enable_dp_attention and self.dp_size and self.tp_size % self.dp_size == 0:
            return self.tp_size // self.dp_size
        return self.tp_size

    def as_dict(self) -> dict[str, Any]:
        """The layout as the plan, the outputs and the status screens carry it (the sizes SGLang
        resolves and what they make of the attention and MoE groups)."""
        return {"tp_size": self.tp_size, "pp_size": self.pp_size, "ep_size": self.ep_size, "dp_size": self.dp_size,
                "enable_dp_attention": self.enable_dp_attention, "moe_a2a_backend": self.moe_a2a_backend,
                "moe_tp_size": self.moe_tp_size, "attn_tp_size": self.attn_tp_size, "nnodes": self.nnodes}

    def describe(self) -> str:
        return layout_text(self.as_dict())

    def node_share(self, rank: int) -> tuple[range, range]:
        """(TP ranks, pipeline stages) node `rank` runs, as SGLang's launcher assigns them: the
        nodes of one stage split its TP group in order (nodes per TP group = nnodes / pp, at least
        1); each node runs pp / nnodes whole stages (at least 1), stage groups in node order."""
        per_group = max(self.nnodes // self.pp_size, 1)
        tp_per_node = self.tp_size // per_group
        pp_per_node = max(self.pp_size // self.nnodes, 1)
        tp = range(tp_per_node * (rank % per_group), tp_per_node * (rank % per_group + 1))
        stage = rank // per_group
        return tp, range(pp_per_node * stage, pp_per_node * (stage + 1))


def layout_of(settings: StackSettings) -> Layout:
    s = settings.strategy
    return Layout(s.tp_size, s.pp_size, s.ep_size, s.dp_size, s.enable_dp_attention, s.moe_a2a_backend, settings.nnodes)


def check_nodes(settings: StackSettings, L: Layout) -> list[SettingError]:
    """Multi-node rules (SGLang: (tp x pp) % nnodes == 0 and its launcher's node split; a plain DP
    replica per node is the router's job). Empty for one node."""
    n, gpus = L.nnodes, settings.host.gpu_count
    if n <= 1:
        return []
    errors = []
    if L.dp_size > 1 and not L.enable_dp_attention:
        errors.append(SettingError(f"{S}.dpSize", f"plain data parallelism (dpSize {L.dp_size}) does not span nodes in "
                                   "SGLang: across nodes DP needs DP attention", "set enableDpAttention: true, or "
                                   "dpSize: 1 (one replica a node is a fleet behind gpu-serving:router)"))
    if (L.tp_size * L.pp_size) % n != 0:
        errors.append(SettingError(S, f"tp {L.tp_size} x pp {L.pp_size} = {L.tp_size * L.pp_size} is not divisible by "
                                   f"the {n} nodes (SGLang splits the world evenly over them)",
                                   f"for {n} nodes of {gpus} GPUs use e.g. tpSize {n * gpus}, or tpSize {gpus}, ppSize {n}"))
        return errors
    if L.pp_size % n != 0 and n % L.pp_size != 0:
        errors.append(SettingError(f"{S}.ppSize", f"ppSize {L.pp_size} over {n} nodes: SGLang gives each node whole "
                                   "pipeline stages (ppSize a multiple of nnodes) or each stage whole nodes (nnodes a "
                                   "multiple of ppSize)", f"use ppSize {n} (one stage a node) or ppSize 1"))
        return errors
    network = settings.strategy.node_network
    if network != "tcp" and settings.serving.environment.get("NCCL_IB_DISABLE") == "1":
        errors.append(SettingError(f"{SERVING}.environment.NCCL_IB_DISABLE",
                                   f"is 1 (no InfiniBand transport), but strategy.nodeNetwork is {network}: NCCL would "
                                   "fall back to sockets between the nodes", "set NCCL_IB_DISABLE: \"0\" in this stack's "
                                   "serving.environment (or Pulumi.yaml's), or nodeNetwork: tcp"))
    if n % L.pp_size == 0 and L.tp_size % (n // L.pp_size) != 0:
        errors.append(SettingError(f"{S}.tpSize", f"tpSize {L.tp_size} does not split over the {n // L.pp_size} nodes of "
                                   "each pipeline stage", f"use tpSize {gpus * (n // L.pp_size)}"))
    return errors


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _world_size_hint(gpus: int, layout: Layout) -> str:
    if layout.ep_size > 1 and layout.ep_size == gpus and layout.tp_size < gpus:
        return (f"EP subdivides the TP group; for EP{gpus} on {gpus} GPUs use tpSize {gpus}, epSize {gpus}")
    options = [f"tpSize {gpus}", f"ppSize {gpus}"]
    if gpus % 2 == 0 and gpus > 2:
        options.append(f"tpSize {gpus // 2}, ppSize 2")
    return "for " + str(gpus) + " GPUs use e.g. " + " or ".join(options)


def check_strategy(settings: StackSettings) -> list[SettingError]:
    """Every rule SGLang applies to the parallel sizes, as `SettingError`s (empty = valid)."""
    errors: list[SettingError] = []
    L = layout_of(settings)
    gpus = settings.host.gpu_count
    model = settings.model

    # DP attention first: it changes what the world size means.
    if L.enable_dp_attention:
        if L.dp_size <= 1:
            errors.append(SettingError(
                f"{S}.enableDpAttention", "DP attention needs dpSize > 1 (SGLang silently turns it off at dpSize 1)",
                f"set dpSize: {L.tp_size} for attention data-parallel on every GPU, or enableDpAttention: false"))
        elif L.tp_size % L.dp_size != 0:
            ok = [d for d in _divisors(L.tp_size) if d > 1]
            # At tpSize 1 no dpSize > 1 divides it: DP attention splits the TP group, so it needs one.
            fix = (f"use dpSize one of {ok}" if ok else
                   f"DP attention splits the TP group: set tpSize: {L.dp_size} (or a multiple), or enableDpAttention: false")
            errors.append(SettingError(
                f"{S}.dpSize", f"with DP attention dpSize must divide tpSize ({L.tp_size} % {L.dp_size} != 0)", fix))

    if L.nnodes > 1:
        if L.world_size != gpus * L.nnodes:
            formula = (f"tp {L.tp_size} x pp {L.pp_size}" if L.enable_dp_attention or L.dp_size == 1
                       else f"dp {L.dp_size} x tp {L.tp_size} x pp {L.pp_size}")
            errors.append(SettingError(
                S, f"world size {formula} = {L.world_size} must equal nnodes {L.nnodes} x host.gpuCount {gpus} = "
                   f"{gpus * L.nnodes} (one rank per GPU on every node)",
                f"for {L.nnodes} nodes of {gpus} GPUs use e.g. tpSize {gpus * L.nnodes}, or tpSize {gpus}, ppSize {L.nnodes}"))
        else:
            errors += check_nodes(settings, L)
    elif L.world_size != gpus:
        formula = (f"tp {L.tp_size} x pp {L.pp_size}" if L.enable_dp_attention
                   else f"dp {L.dp_size} x tp {L.tp_size} x pp {L.pp_size}")
        errors.append(SettingError(
            S, f"world size {formula} = {L.world_size} must equal host.gpuCount {gpus} (one rank per GPU)",
            _world_size_hint(gpus, L)))

    if L.tp_size % L.ep_size != 0:
        ok = [d for d in _divisors(L.tp_size)]
        errors.append(SettingError(
            f"{S}.epSize", f"epSize {L.ep_size} must divide tpSize {L.tp_size} (experts are split inside the TP group: moe_tp = tp / ep)",
            f"use epSize one of {ok}" + (f", or tpSize {L.ep_size}, epSize {L.ep_size}" if L.ep_size <= gpus else "")))
    elif model.num_experts > 0:
        if model.num_experts % L.ep_size != 0:
            ok = [d for d in _divisors(L.tp_size) if model.num_experts % d == 0]
            errors.append(SettingError(
                f"{S}.epSize", f"{model.name} has {model.num_experts} experts, not divisible by epSize {L.ep_size}",
                f"use epSize one of {ok}"))
        moe_tp = L.tp_size // L.ep_size
        if model.moe_intermediate_size % moe_tp != 0:
            ok = [d for d in _divisors(L.tp_size) if model.moe_intermediate_size % (L.tp_size // d) == 0]
            errors.append(SettingError(
                f"{S}.epSize", f"moe_intermediate_size {model.moe_intermediate_size} is not divisible by the MoE TP size tp/ep = {moe_tp}",
                f"use epSize one of {ok}"))
    elif L.ep_size > 1:
        errors.append(SettingError(f"{S}.epSize", f"{model.name} is a dense model (numExperts 0); expert parallelism does not apply",
                                   "use epSize: 1"))

    errors += check_attention_heads(settings, L)

    if L.moe_a2a_backend in A2A_BACKENDS:
        if L.moe_a2a_backend in NVLINK_A2A and settings.host.interconnect != "nvlink":
            errors.append(SettingError(
                f"{S}.moeA2aBackend",
                f"the {L.moe_a2a_backend} all-to-all needs NVLink between GPUs (DeepEP's normal mode moves tokens over "
                f"NVLink between every pair of the node's GPUs and fails while loading without it); "
                f"host.interconnect is {settings.host.interconnect}",
                "use moeA2aBackend: none (EP over all-reduce); set host.interconnect: nvlink only where "
                "`nvidia-smi topo -m` shows NV# between every pair of GPUs"))
        if L.ep_size != L.tp_size:
            errors.append(SettingError(
                f"{S}.epSize",
                f"moeA2aBackend {L.moe_a2a_backend} makes SGLang overwrite ep_size with tp_size ({L.tp_size}); "
                "refusing rather than normalising so the declared layout is the one that runs",
                f"set epSize: {L.tp_size}"))
        if L.moe_a2a_backend == "flashinfer" and not (L.enable_dp_attention and L.dp_size == L.tp_size):
            errors.append(SettingError(
                f"{S}.moeA2aBackend", "the flashinfer all-to-all backend needs DP attention with dpSize == tpSize",
                f"set enableDpAttention: true, dpSize: {L.tp_size}"))
        if L.moe_a2a_backend == "pplx" and not (L.enable_dp_attention and L.dp_size >= 2):
            errors.append(SettingError(
                f"{S}.moeA2aBackend", "the pplx all-to-all backend needs DP attention with dpSize >= 2",
                f"set enableDpAttention: true, dpSize: {L.tp_size}"))

    if L.pp_size > 1:
        if L.pp_size > model.num_layers:
            errors.append(SettingError(f"{S}.ppSize", f"ppSize {L.pp_size} exceeds the model's {model.num_layers} layers",
                                       f"use ppSize <= {model.num_layers}"))
        spec = settings.serving.speculative_algorithm or _flag_value(settings.serving.extra_args, "--speculative-algorithm")
        if spec:
            errors.append(SettingError(
                f"{SERVING}.speculativeAlgorithm", f"pipeline parallelism (ppSize {L.pp_size}) cannot run speculative decoding ({spec})",
                "remove speculativeAlgorithm, or use ppSize: 1"))

    errors += check_extra_args(settings.serving.extra_args)
    errors += check_unit_name(settings)
    return errors


def check_attention_heads(settings: StackSettings, L: Layout) -> list[SettingError]:
    """Each attention-TP rank holds whole heads: SGLang's attention layers assert
    num_heads % attn_tp_size == 0 while the model loads (attn_tp = tp, or tp / dp under DP
    attention). Unchecked when the model does not say its head count."""
    heads = settings.model.num_attention_heads
    attn_tp = L.attn_tp_size
    if not heads or attn_tp < 1 or heads % attn_tp == 0:
        return []
    gpus = settings.host.gpu_count * max(L.nnodes, 1)
    options = [d for d in _divisors(gpus) if heads % d == 0 and d > 1]
    if L.enable_dp_attention:
        where, size = f"{S}.dpSize", f"tp {L.tp_size} / dp {L.dp_size} = {attn_tp}"
        dps = [d for d in _divisors(L.tp_size) if d > 1 and heads % (L.tp_size // d) == 0]
        fix = f"use dpSize one of {dps}" if dps else f"use tpSize one of {options}"
    else:
        where, size = f"{S}.tpSize", f"tp {L.tp_size}"
        fix = (f"use tpSize one of {options} (with ppSize or dpSize making up the {gpus} GPUs)" if options
               else "use ppSize instead of tpSize")
    return [SettingError(where, f"{settings.model.name} has {heads} attention heads, not divisible by the attention "
                                f"TP size {size} (SGLang gives every attention rank whole heads)", fix)]


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1] if i + 1 < len(args) else ""
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def check_extra_args(args: list[str]) -> list[SettingError]:
    errors = []
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        where = f"{SERVING}.extraArgs[{i}]"
        if flag in DEPRECATED_FLAGS:
            errors.append(SettingError(where, f"{flag} is deprecated and rejected by SGLang's parser", DEPRECATED_FLAGS[flag]))
        elif flag in AMBIGUOUS_FLAGS:
            errors.append(SettingError(where, f"{flag} is an ambiguous abbreviation (argparse refuses it)", f"use {AMBIGUOUS_FLAGS[flag]}"))
        elif flag in OWNED_FLAGS:
            owner = OWNED_FLAGS[flag]
            fix = owner.strip("()") if owner.startswith("(") else f"set {owner} instead"
            errors.append(SettingError(where, f"{flag} is written by gpu-serving from a setting; "
                                              "giving it twice would hide the declared value", fix))
        else:
            # SGLang's parser keeps argparse's allow_abbrev: a prefix of a flag gpu-serving writes
            # (--mem-fraction, --por) would be expanded to it and, coming last, win over the setting.
            expands = sorted(o for o in OWNED_FLAGS if o.startswith(flag))
            if expands:
                owner = OWNED_FLAGS[expands[0]]
                errors.append(SettingError(
                    where, f"{flag} is an abbreviation argparse expands to {' or '.join(expands)}, a flag gpu-serving writes "
                    "from a setting (the later one would silently win)",
                    f"set {owner} instead" if not owner.startswith("(") else owner.strip("()")))
    return errors


# systemd's unit name rules (unit_name_is_valid): these characters, at most 255 bytes.
UNIT_NAME = re.compile(r"\A[A-Za-z0-9:_.\\-]+\Z", re.ASCII)
UNIT_NAME_MAX = 255
STACK_STRATEGY = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z", re.ASCII)


def check_unit_name(settings: StackSettings) -> list[SettingError]:
    """The unit name is built from unitPrefix, model.name and the strategy (strategy.name or the
    stack name); systemd must accept it as it is, since it is also an argument to systemctl."""
    name = settings.strategy_name
    if settings.strategy.name is None and not STACK_STRATEGY.fullmatch(name):
        return [SettingError(f"{S}.name", f"the stack name {shown(name)} cannot name a systemd unit",
                             "set strategy.name (lower-case letters, digits, _ -)")]
    unit = unit_name(settings)
    if len(unit) > UNIT_NAME_MAX or not UNIT_NAME.fullmatch(unit):
        return [SettingError(f"{SERVING}.unitPrefix", f"the unit name {shown(unit)} is not one systemd accepts "
                             f"(at most {UNIT_NAME_MAX} characters of letters, digits, : _ . -)",
                             "shorten serving.unitPrefix, model.name or strategy.name")]
    return []


def _visible_count(value: str, gpus: int) -> int:
    """How many GPUs a CUDA_VISIBLE_DEVICES value shows: CUDA reads the list up to the first entry
    it cannot use (an index out of range, -1, a repeat, garbage); GPU-/MIG- UUIDs count as one."""
    seen: set[str] = set()
    for entry in value.split(","):
        entry = entry.strip()
        if entry.isascii() and entry.isdigit() and int(entry) < gpus:
            entry = str(int(entry))
        elif not entry.startswith(("GPU-", "MIG-")):
            break
        if entry in seen:
            break
        seen.add(entry)
    return len(seen)


def _int_arg(args: list[str], flag: str) -> int | None:
    value = _flag_value(args, flag)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def check_visible_gpus(settings: StackSettings) -> list[SettingError]:
    """Settings that hide GPUs from the layout (issue 13.5): the world size needs that many GPUs
    visible to the server. SGLang gives the rank of pipeline stage p, TP rank t the GPU
    base_gpu_id + p x tp + t x gpu_id_step (scheduler launch), counted among the visible GPUs."""
    L = layout_of(settings)
    # The ranks one node runs (the whole world on one node).
    world = L.world_size // L.nnodes
    gpus = settings.host.gpu_count
    errors: list[SettingError] = []
    visible = gpus
    cvd = settings.serving.environment.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        visible = _visible_count(cvd, gpus)
        if visible < world:
            errors.append(SettingError(
                f"{SERVING}.environment.CUDA_VISIBLE_DEVICES",
                f"shows {visible} of the host's {gpus} GPUs, but world size {world} ({L.describe()}) needs {world} visible GPUs",
                f"remove it (gpu-serving sets CUDA_VISIBLE_DEVICES=0..{gpus - 1} itself), or list {world} GPUs"))
            return errors
    args = settings.serving.extra_args
    base, step = _int_arg(args, "--base-gpu-id"), _int_arg(args, "--gpu-id-step")
    if base is None and step is None:
        return errors
    base, step = base or 0, step if step is not None else 1
    tp_here = L.tp_size // max(L.nnodes // L.pp_size, 1) if L.nnodes > 1 else L.tp_size
    groups = world // max(tp_here, 1)
    highest = base + (groups - 1) * tp_here + (tp_here - 1) * step
    if base < 0 or step < 1 or highest >= visible:
        flag = "--base-gpu-id" if _flag_value(args, "--base-gpu-id") is not None else "--gpu-id-step"
        index = next(i for i, a in enumerate(args) if a == flag or a.startswith(flag + "="))
        errors.append(SettingError(
            f"{SERVING}.extraArgs[{index}]",
            f"--base-gpu-id {base} with --gpu-id-step {step} puts ranks on GPU ids up to {highest}, but world size {world} "
            f"needs {world} visible GPUs with ids 0..{visible - 1}",
            "remove --base-gpu-id and --gpu-id-step: each strategy owns all the host's GPUs"))
    return errors
