"""bench/trace.py: the phases of a `pulumi` command from the engine's own log, checked on a
recorded `pulumi up --yes -v=9 --logtostderr --logflow` of a no-op (the engine's JSON lines the
parser reads, from tests/data/bench/trace-up-noop.log). No timing of anything here."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench import stats, trace

LOG = Path(__file__).parent / "data" / "bench" / "trace-up-noop.log"


def t(clock: str) -> float:
    return trace._time(f"2026-12-01T{clock}Z")


def test_an_up_is_two_program_runs_preview_first():
    runs = trace.program_runs(trace.events(LOG.read_text().splitlines()))
    assert [r["preview"] for r in runs] == [True, False]


def test_phases_are_the_intervals_between_the_engines_events():
    preview, update = trace.program_runs(trace.events(LOG.read_text().splitlines()))
    # Times read off the log by hand: Run executing 06:48:39.619866219, the stack resource
    # 06:48:40.557787558, __main__ returned 06:48:41.946605335, the provider launched
    # 06:48:42.03372481 and answered 06:48:43.674246137, the reads 06:48:43.736594424 to
    # 06:48:46.58316981, the program done 06:48:46.611893822, Run returned 06:48:47.037944293.
    assert preview["sdk"] == pytest.approx(t("06:48:40.557787") - t("06:48:39.619866"), abs=1e-6)
    assert preview["program"] == pytest.approx(t("06:48:41.946605") - t("06:48:40.557787"), abs=1e-6)
    assert preview["provider"] == pytest.approx(t("06:48:43.674246") - t("06:48:42.033724"), abs=1e-6)
    assert preview["reads"] == pytest.approx(t("06:48:46.583169") - t("06:48:43.736594"), abs=1e-6)
    assert preview["exit"] == pytest.approx(t("06:48:47.037944") - t("06:48:46.611893"), abs=1e-6)
    assert preview["seconds"] == pytest.approx(t("06:48:47.127415") - t("06:48:39.608326"), abs=1e-6)
    # The update's provider is a process of its own, started again.
    assert update["provider"] == pytest.approx(t("06:48:51.099741") - t("06:48:50.061843"), abs=1e-6)


def test_split_sums_the_runs_and_the_rest_is_the_engines():
    started, ended = t("06:48:39.100000"), t("06:48:53.800000")
    s = trace.split(LOG.read_text().splitlines(), started, ended)
    runs = trace.program_runs(trace.events(LOG.read_text().splitlines()))
    assert s["program_runs"] == 2
    for phase in trace.PHASES:
        assert s[phase] == pytest.approx(sum(r[phase] for r in runs))
    assert s["total"] == pytest.approx(14.7)
    assert s["engine"] == pytest.approx(14.7 - sum(s[p] for p in trace.PHASES))
    assert 0 < s["engine"] < s["total"]


def test_a_program_without_resources_has_no_provider_and_no_reads():
    # The empty program's run: the same events but no provider, no read.
    keep = [ln for ln in LOG.read_text().splitlines() if "Provider[" not in ln and "(resource)" not in ln]
    runs = trace.program_runs(trace.events(keep))
    assert len(runs) == 2 and all(r["provider"] == 0 and r["reads"] == 0 for r in runs)


def test_log_times_and_lines_that_are_not_the_engines():
    assert trace._time("2026-12-01T06:48:42.03372481Z") == pytest.approx(t("06:48:42.033724"))
    assert trace._time("2026-12-01T06:48:42Z") == pytest.approx(t("06:48:42.000000"))
    with pytest.raises(ValueError):
        trace._time("yesterday")
    assert trace.events(["plain output", "{not json", '{"time": "2026-12-01T00:00:00Z"}']) == []


def test_split_table_rows_per_command_and_tool():
    s = trace.split(LOG.read_text().splitlines(), t("06:48:39.1"), t("06:48:53.8"))
    text = stats.split_table({"noop": {"gpu-serving": [s, s], "empty-pulumi": [dict(s, total=1.0)]}})
    lines = text.splitlines()
    assert lines[0].startswith("| command") and "provider process start" in lines[0]
    assert lines[2].startswith("| gpu-serving `pulumi up --yes`") and "| 14.70 " in lines[2]
    assert lines[3].startswith("| empty-pulumi `pulumi up --yes`") and "| 1.00 " in lines[3]


SWITCH = Path(__file__).parent / "data" / "bench" / "trace-up-switch-4-hosts.log"


def at(clock: str) -> float:
    return trace._time(f"2026-12-03T{clock}Z")


def test_a_traced_switch_is_split_into_its_parts():
    # A recorded `pulumi up --yes -v=9` switching 4 hosts tp8 -> ep8, kept to the lines these
    # parsers read (messages cut after "executing"/"success"). Times read off it by hand: the
    # preview 04:05:10.104515 to 04:05:11.344119, its program's Run 04:05:10.112864 and first
    # Read 04:05:10.765734; the update 04:05:11.352864 to 04:05:14.024814; its first service
    # step 04:05:11.947548 (the preview's own service steps, from 04:05:11.165562, are not it)
    # and its last one's end 04:05:13.901568.
    started, ended = at("04:05:10.000000"), at("04:05:14.100000")
    s = trace.switch_phases(SWITCH.read_text().splitlines(), started, ended)
    assert s["hosts"] == 4
    assert s["preview"] == pytest.approx(at("04:05:11.344119") - at("04:05:10.104515"), abs=1e-6)
    assert s["to_first_read"] == pytest.approx(at("04:05:10.765734") - at("04:05:10.112864"), abs=1e-6)
    assert s["to_service"] == pytest.approx(at("04:05:11.947548") - at("04:05:11.352864"), abs=1e-6)
    assert s["service"] == pytest.approx(at("04:05:13.901568") - at("04:05:11.947548"), abs=1e-6)
    assert s["rest"] == pytest.approx(at("04:05:14.024814") - at("04:05:13.901568"), abs=1e-6)
    assert s["total"] == pytest.approx(4.1)
    update = at("04:05:14.024814") - at("04:05:11.352864")
    assert s["cli"] == pytest.approx(4.1 - s["preview"] - update, abs=1e-6)


def test_a_run_that_switched_nothing_is_not_a_traced_switch():
    with pytest.raises(ValueError, match="no service step"):
        trace.switch_phases(LOG.read_text().splitlines(), 0.0, 1.0)  # the recorded no-op
    # Only the preview's service steps (a preview shows the switch, the update never ran it).
    preview_only = [ln for ln in SWITCH.read_text().splitlines() if trace.events([ln])[0][0] < at("04:05:11.350000")]
    assert any("SystemdService" in ln for ln in preview_only) and any("preview=true" in ln for ln in preview_only)
    with pytest.raises(ValueError, match="no service step"):
        trace.switch_phases(preview_only, 0.0, 1.0)


def test_split_switch_table_rows_per_fleet_size():
    one = {"total": 2.5, "hosts": 1, "preview": 0.44, "to_first_read": 0.12, "to_service": 0.2, "service": 1.6,
           "rest": 0.07, "cli": 0.19}
    four = {**one, "hosts": 4, "total": 4.1, "preview": 1.24, "service": 1.95}
    text = stats.split_switch_table({"1": [one, dict(one, total=2.7)], "4": [four]})
    lines = text.splitlines()
    assert "the preview" in lines[0] and "the service steps" in lines[0]
    assert lines[2].startswith("| 1 ") and "| 2.60 " in lines[2] and "| 2 " in lines[2]  # median of 2.5 and 2.7
    assert lines[3].startswith("| 4 ") and "| 1.24 " in lines[3] and "| 1.95 " in lines[3]
