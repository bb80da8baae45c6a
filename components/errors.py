"""Errors a user can act on.

Every problem found in the configuration becomes a `SettingError` that names the setting
(as the user writes it, e.g. ``gpu-serving:strategy.epSize``), the rule it breaks, and a valid
alternative. They are collected, not raised one by one, so a user fixing a stack file sees
every problem at once.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SettingError:
    setting: str
    rule: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.setting}: {self.rule}"
        if self.fix:
            text += f" ({self.fix})"
        return text


class ConfigError(Exception):
    """Raised when the configuration cannot be deployed; carries every `SettingError`."""

    def __init__(self, errors: list[SettingError], context: str = ""):
        self.errors = list(errors)
        self.context = context
        super().__init__(self.render())

    def render(self) -> str:
        head = "invalid configuration" + (f" for {self.context}" if self.context else "")
        if len(self.errors) == 1:
            return f"{head}: {self.errors[0]}"
        lines = [f"{head} ({len(self.errors)} problems):"]
        lines += [f"  - {e}" for e in self.errors]
        return "\n".join(lines)
