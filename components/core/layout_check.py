"""THE verdict on a layout for a host: SGLang's rules (`strategy.check_strategy`, the NVLink
DeepEP needs among them), the GPUs the settings leave visible, and the memory plan.

`plan.build_plan` (so ``python -m components plan``, ``pulumi preview`` and ``up``) and
`advise.judge` call this one function: one rule, one home, so the advisor can never call a
layout valid that the program refuses, or the other way round (issue 36.1;
tests/test_layout_verdicts.py enumerates every layout the advisor considers).
"""
from __future__ import annotations

from .config import StackSettings
from .errors import SettingError
from .memory import MemoryPlan, plan_memory
from .strategy import check_strategy, check_visible_gpus


def check_layout(settings: StackSettings) -> tuple[list[SettingError], MemoryPlan]:
    """(every rule the stack's layout breaks on its host, the memory plan). The plan is made
    whatever the rules say, so a layout that breaks both is told both."""
    errors = check_strategy(settings) + check_visible_gpus(settings)
    memory, memory_errors = plan_memory(settings)
    return errors + memory_errors, memory
