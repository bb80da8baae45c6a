"""A run stopped before anything changes (components/fleet_check.py registers it only then, and
every resource of the stack waits for it): its `check` fails with the message, in the preview as
in the update. The engine calls no check in a destroy or a refresh (it skips a resource it has no
state of), so a refusal about switching never keeps a stack from being destroyed or refreshed.
Never created, so never in a state. Pickled by this module path: it stays here."""
from __future__ import annotations

from pulumi.dynamic import ResourceProvider

# DeployError's import also installs the provider process's one-line errors (no traceback).
from .provider_errors import DeployError


class RunRefusedProvider(ResourceProvider):
    def check(self, _olds, news):
        raise DeployError(str(news.get("message") or "refused"))

    def create(self, props):  # never reached: check refuses first
        raise DeployError(str(props.get("message") or "refused"))
