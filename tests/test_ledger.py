"""The failure ledger, pure (components/core/ledger.py, failure_lines.py): SGLang's real failure
lines classified (tests/data/ledger/classify-*.json), a failed start's signature, the match of a
planned start and the warning said before it."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from components.core import ledger as L
from components.core.failure_lines import classify

from .casedata import DATA, cases

ARGV = ["/root/venv_sglang211/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2.6",
        "--served-model-name", "kimi-k2.6", "--tp-size", "8", "--pp-size", "1", "--ep-size", "8", "--dp-size", "1",
        "--mem-fraction-static", "0.92", "--context-length", "32768", "--trust-remote-code", "--host", "0.0.0.0",
        "--port", "30001"]
LAST_GOOD = [a if a != "0.92" else "0.88" for a in ARGV if a != "--trust-remote-code"]
FACTS = {"gpu_models": ["NVIDIA RTX PRO 6000 Blackwell Server Edition"], "driver_version": "580.95.05"}
OOM_JOURNAL = (DATA / "ledger").joinpath("classify-oom-during-cuda-graph-capture.json")


@pytest.mark.parametrize("name,case", [c for c in cases("ledger") if c[0].startswith("classify-")],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_a_failed_starts_journal_is_classified(name, case):
    cause = classify(case["journal"], case["outcome"])
    assert {"key": cause.key, "label": cause.label, "line": cause.line} == case["expect"]


def oom_failure(**kw) -> L.Failure:
    import json
    journal = json.loads(OOM_JOURNAL.read_text())["journal"]
    args = dict(stack="ep8", host="gpu1", outcome="crashed_during_load", argv=ARGV, journal=journal, model="kimi-k2.6",
                last_good_argv=LAST_GOOD, facts=FACTS, sglang_version="0.5.23",
                when=datetime(2026, 12, 4, 10, 15, 9, tzinfo=timezone.utc))
    return L.signature(**{**args, **kw})


def test_a_failed_starts_signature():
    f = oom_failure()
    assert (f.model, f.model_path, f.layout) == ("kimi-k2.6", "/models/kimi-k2.6", "tp 8 x pp 1 (ep 8, dp 1)")
    assert f.flags_changed == ("--mem-fraction-static 0.92 (last good: 0.88)", "--trust-remote-code (added)")
    assert (f.gpu_model, f.driver_version, f.sglang_version) == ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "580.95.05", "0.5.23")
    assert (f.error_class, f.error) == ("out-of-memory", "CUDA out of memory during CUDA graph capture")
    assert f.time == "2026-12-04T10:15:09Z" and L.Failure.from_dict(f.as_dict()) == f
    assert "--host" not in f.flags and "--port" not in f.flags  # placement: not what was started


def test_the_hash_is_the_flags_not_where_the_server_listens():
    moved = [("10.0.0.9" if a == "0.0.0.0" else "30002" if a == "30001" else a) for a in ARGV]
    assert L.flags_hash(moved) == L.flags_hash(ARGV)
    assert L.flags_hash(LAST_GOOD) != L.flags_hash(ARGV)
    tp4 = [("4" if a == "8" and ARGV[i - 1] == "--tp-size" else a) for i, a in enumerate(ARGV)]
    assert L.flags_hash(tp4) != L.flags_hash(ARGV)  # the layout is in the flags


def test_a_planned_start_matches_the_same_flags_on_the_same_gpu_model():
    f = oom_failure(when=datetime(2026, 12, 4, tzinfo=timezone.utc))
    later = oom_failure(host="gpu2", when=datetime(2026, 12, 5, tzinfo=timezone.utc))
    other_gpu = oom_failure(facts={"gpu_models": ["NVIDIA H200"]})
    other_flags = oom_failure(argv=LAST_GOOD)
    recorded = [f, later, other_gpu, other_flags]
    gpu = FACTS["gpu_models"][0]
    assert L.matches(recorded, argv=ARGV, gpu_model=gpu) == [later, f]  # newest first
    assert L.matches(recorded, argv=LAST_GOOD, gpu_model=gpu) == [other_flags]
    assert L.matches(recorded, argv=ARGV, gpu_model="NVIDIA H200") == [other_gpu]
    assert len(L.matches(recorded, argv=ARGV, gpu_model="")) == 3  # the host not read yet: any GPU model


def test_the_warning_before_a_start():
    f = oom_failure()
    assert L.warning(f) == ("this layout with these flags crashed on gpu1 on 2026-12-04: CUDA out of memory during CUDA "
                            f"graph capture ({f.journal_line})")
    stored = L.Failure.from_dict({**f.as_dict(), "id": "17"})
    said = L.warning(stored, driver_version="590.44.01", sglang_version="0.5.23")
    assert said.endswith("; driver 580.95.05 then, 590.44.01 now [ledger entry 17: "
                         "`python -m components ledger clear --id 17` once it is fixed]")
    timed_out = oom_failure(outcome="timed_out", journal="Load weight begin. avail mem=94.12 GB\n")
    assert L.warning(timed_out).startswith("this layout with these flags timed out on gpu1 on 2026-12-04: "
                                           "did not become ready in time while loading the weights")


def test_a_listing_names_what_failed_and_what_changed():
    text = L.describe(L.Failure.from_dict({**oom_failure().as_dict(), "id": "3"}))
    assert text.splitlines()[0] == ("3  2026-12-04T10:15:09Z  stack ep8 on gpu1: crashed: "
                                    "CUDA out of memory during CUDA graph capture")
    assert "since the last good start: --mem-fraction-static 0.92 (last good: 0.88); --trust-remote-code (added)" in text


def test_plan_preview_and_advise_say_the_same_words(tmp_path, monkeypatch, capsys):
    """A failure recorded for the shipped ep8 stack's start (the ledger in a file beside a file
    backend): `plan` (as a user runs it), `advise` and the preview's check of the service each say
    the one warning core/ledger.py words, before the start; another stack's start says nothing."""
    import shlex
    import subprocess
    import sys

    from components.__main__ import main
    from components.core.plan import check_stack
    from components.core.stack_config import from_files
    from components.remote import cli, ledger_store, preview, ssh

    root = DATA.parent.parent
    argv = check_stack("ep8", from_files(root, "ep8"), root).plans[0][1].unit.exec_start
    url = f"file://{tmp_path}"
    stored = ledger_store.store_for(url).add(oom_failure(argv=argv, host="gpu1"))
    said = L.warning(stored)
    assert said.startswith("this layout with these flags crashed on gpu1 on 2026-12-04: CUDA out of memory during CUDA "
                           "graph capture (") and f"ledger entry {stored.id}" in said

    planned = subprocess.run([sys.executable, "-m", "components", "plan", "--stack", "ep8"], cwd=root, capture_output=True,
                             text=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "PULUMI_BACKEND_URL": url})
    assert planned.returncode == 0 and f"\nwarning        {said}\n" in planned.stdout, planned.stdout[-2000:]
    other = subprocess.run([sys.executable, "-m", "components", "plan", "--stack", "tp8", "--json"], cwd=root,
                           capture_output=True, text=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin",
                                                                "PULUMI_BACKEND_URL": url})
    assert other.returncode == 0 and "this layout with these flags" not in other.stdout

    monkeypatch.setenv("PULUMI_BACKEND_URL", url)
    assert main(["advise", "--stack", "tp8", "--project-dir", str(root), "--results", str(tmp_path / "none")]) == 0
    advised = capsys.readouterr().out
    # Under ep8 among the project's stacks (tp8, advised for, and pp8 say nothing).
    assert f"\n  ep8          valid: tp 8 x pp 1 (ep 8, dp 1)\n    warning: {said}\n  pp8 " in advised, advised[-3000:]
    assert advised.count("this layout with these flags") == 1

    # The preview: the service's check of a stack whose start is coming (nothing of it serves).
    monkeypatch.setattr(cli, "provider_says_preview_things", lambda: True)
    monkeypatch.setattr(ssh, "fetch", lambda t, r: (_ for _ in ()).throw(ssh.RemoteError("not reached in this test")))
    news = {"execStart": shlex.join(argv), "unit": "sglang-kimi-k2.6-ep8.service", "active": True, "stack": "ep8",
            "connection": {"host": "10.0.0.5", "port": 22, "user": "root", "privateKey": "k", "hostKey": "h"}}
    preview.before_change({}, news)
    assert f"switch: warning: {said}\n" in capsys.readouterr().err
    # A serving unit whose update starts nothing: no warning (no start to warn of).
    preview.before_change({**news, "runningServer": "as declared", "configHash": "x"}, {**news, "configHash": "x"})
    assert "this layout" not in capsys.readouterr().err


def test_a_failed_starts_host_read():
    """FAILED_START_SCRIPT's answer: nvidia-smi's query (a line a GPU) and SGLang's version.py (as
    python/sglang/version.py holds it), read after the failure for the signature."""
    answer = ("NVIDIA H200, 580.95.05\nNVIDIA H200, 580.95.05\n@@sglang\n__version__ = \"0.5.23\"\n")
    assert L.parse_failed_start(answer) == ({"gpu_models": ["NVIDIA H200"], "driver_version": "580.95.05"}, "0.5.23")
    assert L.parse_failed_start("@@sglang\n") == ({"gpu_models": [], "driver_version": ""}, "")  # nothing answered
    assert L.venv_of(ARGV) == "/root/venv_sglang211" and L.venv_of(["python3", "-m", "x"]) == ""
    assert L.model_of(ARGV) == "kimi-k2.6" and L.model_of(["/v/bin/python", "--model-path", "/models/ds-v3/"]) == "ds-v3"
