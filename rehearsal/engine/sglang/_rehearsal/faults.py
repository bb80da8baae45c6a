"""The faults the rehearsal engine injects ($REHEARSAL_FAULT), each in the shape the real failure has.

`name` or `name:argument`; an unknown name or a bad argument is refused at start (exit 1), naming
the rule. Multi-node faults need --nnodes > 1; dead_dp_rank needs --dp-size > 1.
"""
from __future__ import annotations

FAULTS = {
    "crash_during_load": "exit non-zero halfway through the weight load, with a traceback in the log",
    "hang_during_load": "never finish loading: the port never opens (SIGTERM still stops it)",
    "oom_during_load": "fail halfway through the weight load with CUDA out of memory",
    # A server that prints a secret it was given: what the deploy must never repeat (issue 44.2).
    "crash_printing_environment": "exit non-zero halfway through the weight load, the error line carrying the "
                                  "process's hub, CUDA, NCCL and SGLang environment with its values, HF_TOKEN's "
                                  "among them (see environment_dump)",
    "die_after_requests": "die_after_requests:N - exit non-zero after serving N generation requests",
    "health_fail_after_ready": "become ready, then answer 503 on /health and /health_generate forever",
    "rewrite_layout": "report an ep_size in /server_info different from the one resolved at launch",
    "never_join": "multi-node: this node never joins the rendezvous (node 0 times out naming it)",
    "crash_after_join": "multi-node: this node exits non-zero after the rendezvous, during the weight load",
    # Issue 39: answers, speed, ranks and the stop.
    "wrong_tokens": "wrong_tokens[:SETTING=VALUE] - answer garbage (a broken kernel): always, or only when the "
                    "resolved server arg SETTING has VALUE (e.g. wrong_tokens:ep_size=8, "
                    "wrong_tokens:attention_backend=flashinfer)",
    "itl_factor": "itl_factor:X - every token takes X times as long (a power-capped GPU, a PCIe link at x4)",
    "dead_dp_rank": "dead_dp_rank:K - DP rank K is wedged: requests it is given never answer, while "
                    "/health_generate still passes (another rank answers); needs --dp-size > 1",
    "slow_drain": "slow_drain:S - after SIGTERM every request in flight streams slowly enough to end S seconds "
                  "after the signal (long generations still running at a stop)",
    # Issue 41: prefill/decode disaggregation.
    "prefill_dies_mid_transfer": "prefill server: the process dies (exit 1) halfway through writing a request's KV cache "
                                 "to the decode server",
    "bootstrap_never_starts": "prefill server: its bootstrap server never opens its port (the ranks cannot register, "
                              "decode servers cannot look it up); it serves its own port as usual",
}
# The variables crash_printing_environment's error line carries: those a load failure's report is
# about (the hub's, CUDA's, NCCL's, SGLang's).
DUMPED_PREFIXES = ("HF_", "HUGGING_FACE_", "CUDA_", "NCCL_", "SGLANG_")


def environment_dump(env) -> str:
    """crash_printing_environment's error (an OSError's message, the traceback's last line): the
    load's failure with the environment it ran in, values and all. Real reports have carried
    secrets verbatim in the same way: an error or warning that prints the token it was passed
    (huggingface/datasets#6412), a failure report that dumps the variables of the process, a
    startup record with the server's credentials (sgl-project/sglang#37457). The token is in the
    journal because the server put it there; the deploy's part is never to repeat it
    (components/core/specs.py `ServiceSpec.secrets`: the values the switch redacts)."""
    dumped = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(DUMPED_PREFIXES)) or "(none set)"
    return ("could not load the checkpoint's weights (rehearsal fault crash_printing_environment); "
            f"environment of the failed process: {dumped}")


PREFILL_FAULTS = ("prefill_dies_mid_transfer", "bootstrap_never_starts")
MULTI_NODE_FAULTS = ("never_join", "crash_after_join")


class Fault:
    """The parsed $REHEARSAL_FAULT: `name` (None: no fault, "invalid": refused) and its argument."""

    def __init__(self, name=None, arg=None, problem: str = ""):
        self.name, self.arg, self.problem = name, arg, problem

    def __eq__(self, other):  # `engine.fault == "hang_during_load"` reads as before
        return self.name == other if isinstance(other, str) or other is None else NotImplemented

    def __hash__(self):
        return hash(self.name)

    def __bool__(self):
        return self.name is not None

    def __str__(self):
        return str(self.name)

    def shown(self) -> str:
        return self.name + (f":{self.arg_text}" if self.arg is not None else "")

    @property
    def arg_text(self) -> str:
        if isinstance(self.arg, tuple):
            return f"{self.arg[0]}={self.arg[1]}"
        return f"{self.arg:g}" if isinstance(self.arg, float) else str(self.arg)

    def check(self, args) -> str:
        """What is wrong with the fault for this command line ("" when nothing)."""
        if self.name == "invalid":
            return self.problem
        if self.name in MULTI_NODE_FAULTS and args.nnodes < 2:
            return (f"REHEARSAL_FAULT={self.name} needs a multi-node world (--nnodes 2 or more); "
                    f"this command line has --nnodes {args.nnodes}")
        if self.name in PREFILL_FAULTS and args.disaggregation_mode != "prefill":
            return (f"REHEARSAL_FAULT={self.name} needs a prefill server (--disaggregation-mode prefill); this command "
                    f"line has --disaggregation-mode {args.disaggregation_mode}")
        if self.name == "dead_dp_rank" and not 0 <= self.arg < args.dp_size:
            return (f"REHEARSAL_FAULT=dead_dp_rank:{self.arg} needs a DP rank of this server: --dp-size is "
                    f"{args.dp_size}, so 0..{args.dp_size - 1}" + (" (and dp_size > 1)" if args.dp_size < 2 else ""))
        if self.name == "wrong_tokens" and self.arg is not None and not hasattr(args, self.arg[0]):
            return f"REHEARSAL_FAULT=wrong_tokens:{self.arg_text}: {self.arg[0]!r} is no server arg"
        return ""

    def garbles(self, args) -> bool:
        """wrong_tokens applies to this server (always, or when its setting has the value)."""
        if self.name != "wrong_tokens":
            return False
        if self.arg is None:
            return True
        have = getattr(args, self.arg[0], None)
        want = self.arg[1]
        if isinstance(have, bool):
            return have == (want.lower() in ("1", "true", "yes"))
        return str(have) == want


def parse(value) -> Fault:
    if not value:
        return Fault()
    name, _, arg = value.strip().partition(":")
    known = ", ".join(sorted(FAULTS))
    if name not in FAULTS:
        return Fault("invalid", problem=f"REHEARSAL_FAULT={value!r} is not a known fault; known: {known}")
    try:
        if name == "die_after_requests":
            return Fault(name, max(int(arg), 1))
        if name == "dead_dp_rank":
            return Fault(name, int(arg))
        if name in ("itl_factor", "slow_drain"):
            number = float(arg)
            if number <= 0:
                raise ValueError
            return Fault(name, number)
    except ValueError:
        return Fault("invalid", problem=f"REHEARSAL_FAULT={value!r}: {FAULTS[name]}")
    if name == "wrong_tokens" and arg:
        key, eq, want = arg.partition("=")
        if not eq or not key:
            return Fault("invalid", problem=f"REHEARSAL_FAULT={value!r}: {FAULTS[name]}")
        return Fault(name, (key.strip().replace("-", "_"), want.strip()))
    return Fault(name)
