"""Readiness verdicts and layout comparison, one JSON file a case (tests/data/readiness, layout)."""
import pytest

from components.core import readiness as R

from .casedata import cases


def assert_reason(name: str, expect: dict, reason: str) -> None:
    """Every case says the reason its verdict gives: `reason` exactly ("" for a verdict that says
    none: ready, undecided), or a non-empty `reason_contains`. A case without either would pass
    whatever the verdict said."""
    if "reason" in expect:
        assert reason == expect["reason"], (name, reason)
        return
    assert expect.get("reason_contains"), (f"{name}: the case gives no reason; add expect.reason_contains, or "
                                           f"expect.reason (\"\" when the verdict says none); it said {reason!r}")
    assert expect["reason_contains"] in reason, (name, reason)


@pytest.mark.parametrize("name,case", cases("readiness"), ids=lambda x: x if isinstance(x, str) else "")
def test_verdict_sequence(name, case):
    observations = [R.Observation(elapsed=o["elapsed"], unit=R.UnitState(**o["unit"]), health=o["health"],
                                  logged_ready=o.get("logged_ready", False)) for o in case["observations"]]
    baseline = observations[0].unit if not case.get("ever_healthy") else R.UnitState("active", "running", 100, 0)
    phases, verdict = [], None
    for obs in observations:
        verdict = R.judge(baseline, obs, case["deadline"], case.get("ever_healthy", False), case.get("unhealthy_after"))
        phases.append(verdict.phase)
        if verdict.outcome:
            break
    expect = case["expect"]
    assert verdict.outcome == expect["outcome"], verdict
    if "phases" in expect:
        assert phases == expect["phases"]
    assert_reason(name, expect, verdict.reason)


@pytest.mark.parametrize("name,case", cases("layout"), ids=lambda x: x if isinstance(x, str) else "")
def test_layout_comparison(name, case):
    assert R.compare_layout(case["declared"], case["server_info"]) == case["mismatches"]


def test_backoff_grows_to_the_cap():
    pauses, p = [], 0.0
    for _ in range(10):
        p = R.next_poll(p, 2, 30)
        pauses.append(p)
    assert pauses[0] == 2 and pauses[-1] == 30 and pauses == sorted(pauses)


@pytest.mark.parametrize("name,case", cases("readiness/refresh"), ids=lambda x: x if isinstance(x, str) else "")
def test_refresh_look(name, case):
    o = case["observation"]
    verdict = R.judge_now(R.Observation(elapsed=0.0, unit=R.UnitState(**o["unit"]), health=o["health"]))
    assert verdict.outcome == case["expect"]["outcome"] and verdict.outcome in R.OUTCOMES, verdict
    assert_reason(name, case["expect"], verdict.reason)


@pytest.mark.parametrize("name,case", cases("readiness/report"), ids=lambda x: x if isinstance(x, str) else "")
def test_one_report_builder(name, case):
    v = case["verdict"]
    info_read = ("/server_info", case["info"], case.get("models") or {}) if "info" in case else None
    report = R.build_report(R.Verdict(v["outcome"], v["phase"], v.get("reason", "")), unit="u.service", url="http://x",
                            declared=case["declared"], checked_at="2026-01-01T00:00:00Z", info_read=info_read,
                            seconds_to_ready=case.get("seconds_to_ready")).as_dict()
    for key, want in case["expect"].items():
        assert report[key] == want, (key, report)


def test_every_layout_mismatch_lists_the_fields():
    for name, case in cases("layout"):
        if case["mismatches"]:
            reason = R.layout_reason(case["mismatches"])
            for m in case["mismatches"]:
                assert f"{m['field']} declared {m['declared']} running {m['running']}" in reason, name


def test_a_report_is_never_built_from_an_undecided_verdict():
    with pytest.raises(ValueError):
        R.build_report(R.Verdict(None, "loading"), unit="u", url="x", declared={}, checked_at="")


@pytest.mark.parametrize("name,case", cases("readiness/running"), ids=lambda x: x if isinstance(x, str) else "")
def test_what_the_running_server_was_started_from(name, case):
    differences = R.compare_running(case["declared_argv"], case["declared_environment"], case.get("secrets", {}),
                                    case["running_argv"], case["running_environment"], case.get("manager_environment", {}))
    assert differences == case["expect"]
    assert "hf_" not in " ".join(differences)  # a secret value is never named


def test_config_hash_covers_argv_environment_and_secrets_only():
    argv = ["python", "-m", "sglang.launch_server", "--tp-size", "8"]
    env = {"NCCL_ALGO": "Ring", "PATH": "/a b"}
    base = R.running_config_hash(argv, env, R.secret_hash({"HF_TOKEN": "x"}))
    assert R.running_config_hash(argv, dict(reversed(env.items())), R.secret_hash({"HF_TOKEN": "x"})) == base
    assert R.running_config_hash(argv + ["--pp-size", "2"], env, R.secret_hash({"HF_TOKEN": "x"})) != base
    assert R.running_config_hash(argv, {**env, "NCCL_ALGO": "Tree"}, R.secret_hash({"HF_TOKEN": "x"})) != base
    assert R.running_config_hash(argv, env, R.secret_hash({"HF_TOKEN": "y"})) != base
