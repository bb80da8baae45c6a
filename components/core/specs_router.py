"""The contracts of the router's resources (core/specs.py says why a resource's props are a
contract): SGLang's router (smg) as a unit, and its readiness. A fleet host's own place behind the
router is core/specs.py's RouterPlace, part of its service."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .specs import Props, _mapping


@dataclass(frozen=True)
class RouterAdminAccess:
    """How to reach the router's admin API: on its own machine, through its venv's python, with
    the admin key (given on stdin, never on a command line)."""

    connection: Any
    bind: str
    port: int
    venv_path: str
    admin_key: Any

    @classmethod
    def from_props(cls, props: Props) -> "RouterAdminAccess":
        return cls(connection=props.get("connection"), bind=str(props.get("bind") or "127.0.0.1"),
                   port=int(props.get("port") or 0), venv_path=str(props.get("venvPath") or ""),
                   admin_key=str(props.get("adminKey") or ""))

    def to_props(self) -> dict[str, Any]:
        return {"connection": self.connection, "bind": self.bind, "port": self.port, "venvPath": self.venv_path,
                "adminKey": self.admin_key}


@dataclass(frozen=True)
class RouterServiceSpec:
    """The router's unit (RouterService): enabled and active, restarted when its unit text changed."""

    access: RouterAdminAccess
    unit: str
    unit_text: str

    # What a change of restarts or moves the router.
    DIFFED = ("unit", "unitText", "bind", "port", "venvPath", "adminKey", "connection")

    @classmethod
    def from_props(cls, props: Props) -> "RouterServiceSpec":
        return cls(access=RouterAdminAccess.from_props(props), unit=str(props.get("unit") or ""),
                   unit_text=str(props.get("unitText") or ""))

    def to_props(self) -> dict[str, Any]:
        access = self.access.to_props()
        return {"connection": access.pop("connection"), "unit": self.unit, "unitText": self.unit_text, **access}


@dataclass(frozen=True)
class RouterReadinessSpec:
    """The router's readiness (RouterReadiness): every declared worker listed healthy and ready."""

    access: RouterAdminAccess
    expected: tuple[str, ...]
    names: Mapping[str, str] = field(default_factory=dict)  # worker URL -> the fleet entry's name
    timeout_seconds: float = 120.0

    DIFFED = ("expected", "port", "connection", "adminKey")

    @classmethod
    def from_props(cls, props: Props) -> "RouterReadinessSpec":
        return cls(access=RouterAdminAccess.from_props(props), expected=tuple(str(u) for u in props.get("expected") or ()),
                   names=_mapping(props.get("names")), timeout_seconds=float(props.get("timeoutSeconds") or 120))

    def to_props(self) -> dict[str, Any]:
        return {**self.access.to_props(), "expected": list(self.expected), "names": dict(self.names),
                "timeoutSeconds": self.timeout_seconds}
