"""`gpu-serving:metrics`: where `pulumi up` rewrites the stack's Prometheus target file
(components/scrape_targets.py `rewrite_after_up`; core/scrape.py renders it). Read by the program
on the machine that runs it, never sent to a host. Refusals in the bad-input corpus.

    gpu-serving:metrics:
      targetsDir: ~/.local/state/gpu-serving-watch/prometheus/targets   # the default: the watch's default --state-dir

The file is written only when that directory exists (`metrics --scrape-config` or a watch made
it: this machine's Prometheus reads there); an `up` never creates it.
"""
from __future__ import annotations

import re
from typing import Annotated, Any

from .config_fields import Settings, text_setting

METRICS_KEY = "metrics"
# Where `watch` with its default --state-dir keeps them, and `metrics --scrape-config` writes them.
DEFAULT_TARGETS_DIR = "~/.local/state/gpu-serving-watch/prometheus/targets"
_LOCAL_DIR = re.compile(r"(~|/)[A-Za-z0-9_./+@-]*", re.ASCII)


class MetricsSettings(Settings):
    """gpu-serving:metrics (the module docstring): read by the program on this machine, never sent to a host."""

    targets_dir: Annotated[str, text_setting(1024, "directory on this machine (absolute, or under ~)", _LOCAL_DIR)] = \
        DEFAULT_TARGETS_DIR


def parse_metrics(raw: Any) -> MetricsSettings:
    """The settings (raises pydantic's ValidationError; config.parse_settings names the setting)."""
    return MetricsSettings() if raw is None else MetricsSettings.model_validate(raw)
