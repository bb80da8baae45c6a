"""Rules the settings check (config.py) shares with the dynamic provider's process.

The provider renders nothing from settings and never validates them, but its modules check a
few values again where they are used (an environment variable's name, the router's key, a
secret's characters). Those rules live here, without pydantic, so that a provider process,
started for every program run, does not import the settings models (docs/benchmarks.md,
issue 18: ~0.16 s of every provider's first call).
"""
from __future__ import annotations

import re

NAMESPACE = "gpu-serving"


def rx(body: str) -> re.Pattern[str]:
    """A whole-string, ASCII-only pattern: safe even where someone later calls .match."""
    return re.compile(rf"\A(?:{body})\Z", re.ASCII)


ENV_KEY = rx(r"[A-Za-z_][A-Za-z0-9_]*")
# The router's admin key: smg reads --control-plane-api-keys as 'id:name:role:key'.
ROUTER_KEY = rx(r"[A-Za-z0-9._~+/=-]{16,256}")
# Variable names that hold credentials: those come only as Pulumi secrets, never as plain settings
# (config.py refuses them), and a value under such a name is never shown (the drift watch, status).
SECRET_ENV_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS")
SECRET_ENV_SUFFIXES = ("_API_KEY", "_ACCESS_KEY", "_PRIVATE_KEY", "_SECRET_KEY")


def credential_name(key: str) -> bool:
    """A variable named like a credential (HF_TOKEN, AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY)."""
    return any(p in SECRET_ENV_PARTS for p in key.upper().split("_")) or key.upper().endswith(SECRET_ENV_SUFFIXES)


# Characters that would end or extend a secret's KEY="value" line in the environment file.
SECRET_FORBIDDEN = "\n\r\0\"\\$`'"


def breaks_secret_line(value: str) -> bool:
    """A secret that cannot be written as its KEY="value" line: empty, with whitespace, or with
    one of SECRET_FORBIDDEN (a token never has them). Checked by the settings and by the file's
    provider."""
    return not value or any(c in value for c in SECRET_FORBIDDEN) or any(c.isspace() for c in value)
