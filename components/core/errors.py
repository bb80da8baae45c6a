"""Errors a user can act on.

Every problem found in the configuration becomes a `SettingError` that names the setting
(as the user writes it, e.g. ``gpu-serving:strategy.epSize``), the rule it breaks, and a valid
alternative. They are collected, not raised one by one, so a user fixing a stack file sees
every problem at once.

A message that quotes a value quotes it through `shown`: a value that looks like a key or a
token is described (its length and kind), never printed; a long value is cut short; control
characters and non-ASCII letters are escaped so a lookalike digit is visible as what it is.
`SettingError` applies the same redaction and bounds to its own text as a last line of defence,
and `ConfigError` bounds how many problems it prints.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Longest value quoted whole in a message; longer ones are cut to their start.
SHOWN_MAX = 60
# Bounds of one problem's text and of the whole error: a 10 MB value yields a short message.
SETTING_MAX = 200
RULE_MAX = 1000
FIX_MAX = 600
# A file of a thousand bad entries names the first ones, not a thousand lines (issue 13.8).
ERRORS_SHOWN = 20
MESSAGE_MAX = 8000

# Credentials recognised by their form (prefixes the issuers document), first match wins.
_SECRET_KINDS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"), "PEM private key"),
    (re.compile(r"-----BEGIN [A-Z0-9 ]+-----"), "PEM block"),
    (re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}", re.ASCII), "Hugging Face token"),
    (re.compile(r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})", re.ASCII), "GitHub token"),
    (re.compile(r"(?<![A-Za-z0-9])glpat-[A-Za-z0-9_-]{16,}", re.ASCII), "GitLab token"),
    (re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}", re.ASCII), "API key (sk-...)"),
    (re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}", re.ASCII), "Slack token"),
    (re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])", re.ASCII), "AWS access key id"),
    (re.compile(r"(?<![A-Za-z0-9])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", re.ASCII), "JSON web token"),
]
# A long run of base64/base62 with upper, lower and digits and no separator a path or a model
# id would have: what a generated secret looks like.
_RANDOM_RUN = re.compile(r"[A-Za-z0-9+/=_]{32,}", re.ASCII)
_PRIVATE_KEY_WORDS = ("PRIVATE KEY", "PuTTY-User-Key-File", "OPENSSH PRIVATE")


def _looks_random(run: str) -> bool:
    if run.startswith("/"):
        return False  # a path
    return (sum(c.isdigit() for c in run) >= 3 and sum(c.isupper() for c in run) >= 3
            and sum(c.islower() for c in run) >= 3)


def secret_kind(value: str, *, generic: bool = True) -> str | None:
    """What kind of credential `value` looks like, or None. `generic` also counts any long
    random-looking run (right for messages; refusals use the documented forms only, so an
    ordinary setting is never refused for looking random)."""
    if not isinstance(value, str):
        return None
    if any(w in value for w in _PRIVATE_KEY_WORDS):
        return "private key"
    for pattern, kind in _SECRET_KINDS:
        if pattern.search(value):
            return kind
    if generic and any(_looks_random(m.group()) for m in _RANDOM_RUN.finditer(value)):
        return "token-like value"
    return None


def _escaped(text: str) -> str:
    """repr, with non-ASCII escaped too: '\\u0661' shows a lookalike digit for what it is."""
    return ascii(text) if not text.isascii() or not text.isprintable() else repr(text)


def shown(value: object) -> str:
    """`value` as a message may quote it: a credential described, never printed; a long value
    cut short with its length; control characters and non-ASCII escaped."""
    if not isinstance(value, str):
        text = repr(value)
        return text if len(text) <= SHOWN_MAX else f"{text[:SHOWN_MAX]}... ({len(text):,} characters)"
    kind = secret_kind(value)
    if kind:
        return f"a {len(value):,}-character {kind} (not shown)"
    if len(value) > SHOWN_MAX:
        return f"{_escaped(value[:40])}... (a {len(value):,}-character value)"
    return _escaped(value)


def _redacted(text: str, bound: int) -> str:
    """Free text made safe to print: credentials inside it replaced, control characters
    escaped, cut to `bound` characters."""
    text = str(text)
    if len(text) > 4 * bound:
        text = text[: 4 * bound]  # redaction of a huge text would be slow and is cut anyway
    for pattern, kind in _SECRET_KINDS:
        described = f"[a {kind}, not shown]"
        text = pattern.sub(lambda m: described, text)  # a function: the text is not a template
    if any(w in text for w in _PRIVATE_KEY_WORDS):
        text = "[text holding a private key, not shown]"
    text = _RANDOM_RUN.sub(lambda m: "[a token-like value, not shown]" if _looks_random(m.group()) else m.group(), text)
    text = "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)
    return text if len(text) <= bound else text[: bound - 20] + f"... ({len(text):,} characters)"


@dataclass(frozen=True)
class SettingError:
    setting: str
    rule: str
    fix: str = ""

    def __post_init__(self) -> None:
        # The last line of defence: whatever a check wrote, what is printed is bounded, on one
        # line, and quotes no credential.
        object.__setattr__(self, "setting", _redacted(self.setting, SETTING_MAX))
        object.__setattr__(self, "rule", _redacted(self.rule, RULE_MAX))
        object.__setattr__(self, "fix", _redacted(self.fix, FIX_MAX))

    def __str__(self) -> str:
        text = f"{self.setting}: {self.rule}"
        if self.fix:
            text += f" ({self.fix})"
        return text


class ConfigError(Exception):
    """Raised when the configuration cannot be deployed; carries every `SettingError`."""

    def __init__(self, errors: list[SettingError], context: str = ""):
        self.errors = list(errors)
        self.context = _redacted(context, SETTING_MAX)
        super().__init__(self.render())

    def render(self) -> str:
        head = "invalid configuration" + (f" for {self.context}" if self.context else "")
        if len(self.errors) == 1:
            return f"{head}: {self.errors[0]}"
        lines = [f"{head} ({len(self.errors)} problems):"]
        lines += [f"  - {e}" for e in self.errors[:ERRORS_SHOWN]]
        if len(self.errors) > ERRORS_SHOWN:
            lines.append(f"  ... and {len(self.errors) - ERRORS_SHOWN} more (fix these first)")
        text = "\n".join(lines)
        if len(text) > MESSAGE_MAX:
            text = text[:MESSAGE_MAX] + f"\n  ... (cut at {MESSAGE_MAX:,} characters)"
        return text
