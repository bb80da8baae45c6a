"""What the transport raises: a remote step that failed, in a message safe to show."""
from __future__ import annotations

from typing import Iterable


class RemoteError(Exception):
    """A remote step failed; the message is safe to show (secrets redacted)."""


class Unreachable(RemoteError):
    """No SSH connection could be opened (refused, no route, no answer within the bound)."""


def redact(text: str, secret_values: Iterable[str]) -> str:
    for value in secret_values:
        if value and len(value) >= 4:
            text = text.replace(value, "[secret]")
    return text
