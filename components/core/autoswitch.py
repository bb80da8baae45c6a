"""`gpu-serving:autoswitch`: when the traffic's recommendation may be applied by `watch --apply`,
and the pure decision with its log record. Pure (cases tests/data/autoswitch/; refusals in the
bad-input corpus).

    gpu-serving:autoswitch:
      windows: ["22:00-06:00", "12:00-13:00"]   # when a switch may start (timezone below; may cross midnight)
      timezone: UTC                             # IANA name
      minDwellMinutes: 60                       # no switch sooner after the last one
      maxSwitchesPerDay: 4                      # switches in the last 24 h
      requireRouter: true                       # only a fleet behind the router (a rolling switch, no failed request)
      horizonMinutes: 60                        # the gain is counted over the next hour...
      hysteresisPercent: 10                     # ...and must beat the current stack by 10 %...
      switchMinutes: 15                         # ...after a host's switch time, when no start is recorded
      observeMinutes: 30                        # the load is the median of the last 30 min of ticks
      candidates: [pp8, tp8]                    # the stacks the traffic may move between (default: every
                                                # stack of the project on the same machines)

The decision (`decide`): the recommendation says switch, and the time is inside a window, the
dwell is over, the day's budget is not spent, no drift and no failed readiness is open on the
stacks involved, the fleet is behind the router (unless requireRouter is false), and the switch
is no outage (a prefill/decode stack stops its pair at once: never applied). Each check is named
in the decision, whichever way it goes.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone as tz
from typing import TYPE_CHECKING, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from .recommend import Policy, Recommendation

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

_STACK = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)  # a Pulumi.<stack>.yaml's name
MAX_CANDIDATES = 16
_WINDOW = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])-([01][0-9]|2[0-3]|24):([0-5][0-9])", re.ASCII)
MAX_WINDOWS = 24
DAY = 86400.0


class AutoswitchSettings(BaseModel):
    """gpu-serving:autoswitch (module docstring)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True)

    windows: tuple[str, ...] = Field((), max_length=MAX_WINDOWS)
    timezone: str = Field("UTC", max_length=64)
    min_dwell_minutes: int = Field(60, ge=5, le=10080)
    max_switches_per_day: int = Field(4, ge=0, le=48)
    require_router: bool = True
    horizon_minutes: int = Field(60, ge=5, le=1440)
    hysteresis_percent: float = Field(10.0, ge=0, le=100)
    switch_minutes: float = Field(15.0, gt=0, le=240)
    observe_minutes: int = Field(30, ge=1, le=1440)
    candidates: tuple[str, ...] = Field((), max_length=MAX_CANDIDATES)

    @field_validator("windows", "candidates", mode="before")
    @classmethod
    def _list(cls, value: Any) -> Any:
        if isinstance(value, list):
            return tuple(value)
        return value

    @field_validator("candidates")
    @classmethod
    def _stacks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _STACK.fullmatch(name):
                raise ValueError(f"{name[:40]!r} is not a stack name (a Pulumi.<stack>.yaml of the project), e.g. pp8")
        if len(set(value)) != len(value):
            raise ValueError("names a stack twice")
        return value

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for w in value:
            m = _WINDOW.fullmatch(w)
            if not m:
                raise ValueError(f"{w[:40]!r} is not a time window HH:MM-HH:MM (24 h clock), e.g. 22:00-06:00")
            if m.group(1, 2) == m.group(3, 4):
                raise ValueError(f"{w!r} starts and ends at the same minute: give a window of some length")
            if m.group(3) == "24" and m.group(4) != "00":
                raise ValueError(f"{w!r} ends after 24:00")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
        if not re.fullmatch(r"[A-Za-z0-9_+\-/]+", value, re.ASCII):
            raise ValueError("is not an IANA time zone name, e.g. UTC or Europe/Berlin")
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not a time zone this machine knows (IANA name, e.g. UTC or Europe/Berlin)")
        return value

    def policy(self) -> Policy:
        return Policy(horizon_seconds=self.horizon_minutes * 60.0, hysteresis_percent=self.hysteresis_percent,
                      min_dwell_seconds=self.min_dwell_minutes * 60.0, switch_seconds=self.switch_minutes * 60.0)


def parse(raw: Any) -> AutoswitchSettings:
    """The settings (raises pydantic's ValidationError; config.parse_settings names the setting)."""
    return AutoswitchSettings() if raw is None else AutoswitchSettings.model_validate(raw)


def in_window(windows: tuple[str, ...], when: datetime, zone: str = "UTC") -> Optional[str]:
    """The window `when` (an aware time) falls in, or None."""
    from zoneinfo import ZoneInfo
    local = when.astimezone(ZoneInfo(zone))
    minute = local.hour * 60 + local.minute
    for w in windows:
        m = _WINDOW.fullmatch(w)
        assert m is not None  # the windows were checked by AutoswitchSettings
        start, end = int(m.group(1)) * 60 + int(m.group(2)), int(m.group(3)) * 60 + int(m.group(4))
        inside = start <= minute < end if start < end else (minute >= start or minute < end)
        if inside:
            return w
    return None


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Decision:
    apply: bool
    why: str
    checks: tuple[Check, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(rec: Recommendation, settings: AutoswitchSettings, *, now: float, behind_router: bool, drift: list[str],
           failed_readiness: list[str], switches: list[float], last_switch_at: Optional[float],
           outage: Optional[str] = None) -> Decision:
    """Whether `watch --apply` performs `rec` (a recommend.Recommendation) now. `switches`: when
    the applied switches started (seconds since the epoch); `drift`, `failed_readiness`: what is
    open on the stacks involved (host: what), each blocks; `outage`: why the switch would stop
    every server at once (a prefill/decode stack), None when it rolls."""
    when = datetime.fromtimestamp(now, tz.utc)
    window = in_window(settings.windows, when, settings.timezone)
    today = [s for s in switches if now - s < DAY]
    since = None if last_switch_at is None else now - last_switch_at
    checks = [
        Check("recommended", rec.action == "switch", rec.line()),
        Check("window", window is not None,
              f"inside {window} ({settings.timezone})" if window else
              (f"{when.astimezone(_zone(settings.timezone)):%H:%M} {settings.timezone} is outside "
               f"{', '.join(settings.windows)}" if settings.windows else "no window declared (autoswitch.windows)")),
        Check("dwell", since is None or since >= settings.min_dwell_minutes * 60,
              "no switch seen yet" if since is None else
              f"last switch {since / 60:.0f} min ago (minimum {settings.min_dwell_minutes} min)"),
        Check("budget", len(today) < settings.max_switches_per_day,
              f"{len(today)} of {settings.max_switches_per_day} switches in the last 24 h"),
        Check("drift", not drift, "no drift open" if not drift else "drift open: " + "; ".join(drift)),
        Check("readiness", not failed_readiness,
              "readiness ready" if not failed_readiness else "readiness failed: " + "; ".join(failed_readiness)),
        Check("router", behind_router or not settings.require_router,
              "behind the router (a rolling switch)" if behind_router else
              "no router in front (autoswitch.requireRouter): every host would stop at once"),
        Check("outage", outage is None, "no outage: the hosts switch in turn" if outage is None else outage),
    ]
    failed = [c for c in checks if not c.ok]
    if not failed:
        return Decision(True, f"apply: {rec.current} -> {rec.recommended} ({window})", tuple(checks))
    return Decision(False, "recommend only: " + "; ".join(c.detail for c in failed), tuple(checks))


def _zone(name: str) -> ZoneInfo:
    from zoneinfo import ZoneInfo
    return ZoneInfo(name)


def log_record(rec: Recommendation, decision: Decision, *, now: float) -> dict[str, Any]:
    """The decision log's record (JSON line): why, the expected gain, and room for the measured
    outcome (`with_outcome` fills it a horizon later)."""
    figures = {f.stack: f for f in rec.figures}
    mine, target = figures.get(rec.current), figures.get(rec.recommended)
    return {"at": now, "from": rec.current, "to": rec.recommended, "applied": decision.apply, "why": decision.why,
            "recommendation": rec.reason, "concurrency": rec.concurrency,
            "expected": {"tok_s_before": mine.tok_s if mine else None, "tok_s_after": target.tok_s if target else None,
                         "basis": target.basis if target else None, "net_gain_tokens": rec.gain_tokens,
                         "cost_tokens": rec.cost_tokens},
            "checks": [asdict(c) for c in decision.checks], "outcome": None}


def with_outcome(record: dict[str, Any], *, measured_tok_s: Optional[float], measured_before: Optional[float], at: float) -> dict[str, Any]:
    """The record with what the switch measurably gave: output tok/s after against before, and
    against what was expected."""
    expected = record["expected"].get("tok_s_after")
    out = {"at": at, "tok_s_before": measured_before, "tok_s_after": measured_tok_s}
    if measured_tok_s is not None and expected:
        out["of_expected_percent"] = round(100 * measured_tok_s / expected, 1)
    if measured_tok_s is not None and measured_before:
        out["gain_percent"] = round(100 * (measured_tok_s / measured_before - 1), 1)
    return {**record, "outcome": out}
