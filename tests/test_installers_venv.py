"""Python venv install: the pure parts, one JSON file a case (tests/data/installers/), plus the
provider's diff (no host needed for it)."""
import subprocess
import sys

from pathlib import Path

import pytest

from components import venv as venv_component
from components.core import venv as V
from components.core.config import VenvSettings
from components.core.errors import ConfigError
from components.remote.installers import PythonVenvProvider, parse_sha256sum

from .casedata import cases


def _ids(x):
    return x if isinstance(x, str) else ""


@pytest.mark.parametrize("name,case", cases("installers/pip-list"), ids=_ids)
def test_pip_list(name, case):
    text = "\n".join(case["output"]) + "\n"
    if "error" in case:
        with pytest.raises(ValueError, match=case["error"]):
            V.parse_pip_list(text)
        return
    assert V.parse_pip_list(text) == case["expect"]


@pytest.mark.parametrize("name,case", cases("installers/venv"), ids=_ids)
def test_venv_probe_view_and_plan(name, case):
    observed = V.parse_venv_probe("\n".join(case["probe"]) + "\n")
    for key, value in case.get("observed", {}).items():
        assert getattr(observed, key) == value, key
    view = V.observed_view(case["packages"], observed)
    for key, value in case.get("view", {}).items():
        assert view[key] == value, key
    plan = V.venv_plan(python=case["python"], packages=case["packages"], observed=observed,
                       rebuilt_wheels=case.get("rebuilt_wheels", []))
    expect = case["plan"]
    assert (plan.create, plan.clear, plan.install, list(plan.force_reinstall)) == \
        (expect["create"], expect["clear"], expect["install"], expect["force_reinstall"]), plan
    if "reason_contains" in expect:
        assert expect["reason_contains"] in plan.reason
    if "refuse_contains" in expect:
        assert plan.refuse and expect["refuse_contains"] in plan.refuse
    else:
        assert plan.refuse is None


@pytest.mark.parametrize("name,case", cases("installers/wheelhouse"), ids=_ids)
def test_wheelhouse_against_declared_packages(name, case):
    problems = V.wheelhouse_problems(case["packages"], case["files"], "/srv/wheels")
    assert [p.setting for p in problems] == [e["setting"] for e in case["errors"]]
    for problem, expected in zip(problems, case["errors"]):
        assert expected["contains"] in str(problem)


def test_distribution_names():
    assert V.distribution_of("sglang_rehearsal-0.0.1+rehearsal-py3-none-any.whl") == ("sglang-rehearsal", "0.0.1+rehearsal")
    assert V.distribution_of("torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl") == ("torch", "2.9.1")
    assert V.distribution_of("flash_attn-2.8.3.tar.gz") == ("flash-attn", "2.8.3")
    assert V.distribution_of("README.txt") is None


def test_probe_script_against_a_local_venv(tmp_path):
    """The probe is plain sh + the venv's python: run it here on a real venv and on non-venvs."""
    def probe(path):
        out = subprocess.run(["sh", "-c", V.PROBE_SCRIPT, "sh", str(path)], capture_output=True, text=True, timeout=120).stdout
        return V.parse_venv_probe(out)

    assert probe(tmp_path / "nothing").state == "absent"
    (tmp_path / "empty").mkdir()
    assert probe(tmp_path / "empty").state == "absent"
    (tmp_path / "other").mkdir()
    (tmp_path / "other/file").write_text("x")
    assert probe(tmp_path / "other").state == "not-a-venv"
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=300)
    observed = probe(tmp_path / "venv")
    assert observed.state == "venv" and observed.pip_ok
    assert observed.python_minor == "%d.%d" % sys.version_info[:2] and "pip" in observed.packages


def test_rehearsal_wheelhouse_props(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_SERVING_CACHE", str(tmp_path))
    settings = VenvSettings.model_validate({"packages": ["sglang-rehearsal==0.0.1+rehearsal"], "wheelhouse": "rehearsal"})
    props = venv_component.install_props(settings)
    wh = props["wheelhouse"]
    # A directory per engine content: another checkout's engine (same version) never replaces it.
    assert wh["remoteDir"] == V.WHEELHOUSE_DIR and Path(wh["localDir"]).parent == tmp_path / "rehearsal/wheelhouse"
    assert Path(wh["localDir"]).name == next(iter(wh["files"].values()))[:16]
    assert list(wh["files"]) == ["sglang_rehearsal-0.0.1+rehearsal-py3-none-any.whl"]
    # The engine wheel is byte-for-byte reproducible, so a second preview sees no change.
    assert venv_component.install_props(settings)["wheelhouse"] == wh
    with pytest.raises(ConfigError, match=r"venv.packages\[0\].*has no wheel"):
        venv_component.install_props(VenvSettings.model_validate({"packages": ["sglang-rehearsal==9.9"], "wheelhouse": "rehearsal"}))


def test_local_wheelhouse_props(tmp_path):
    (tmp_path / "sglang-0.5.23-py3-none-any.whl").write_bytes(b"wheel")
    (tmp_path / "notes.txt").write_text("not a wheel")
    props = venv_component.install_props(VenvSettings.model_validate({"packages": ["sglang[all]==0.5.23"], "wheelhouse": str(tmp_path)}))
    assert list(props["wheelhouse"]["files"]) == ["sglang-0.5.23-py3-none-any.whl"]
    with pytest.raises(ConfigError, match="is not a directory"):
        venv_component.install_props(VenvSettings.model_validate({"wheelhouse": str(tmp_path / "missing")}))
    assert venv_component.install_props(VenvSettings())["wheelhouse"] is None


def test_sha256sum_parsing():
    text = ("a" * 64 + "  /var/lib/gpu-serving/wheelhouse/x-1-py3-none-any.whl\n"
            + "b" * 64 + "  /var/lib/gpu-serving/apt/cuda/InRelease\nfind: '/nope': No such file or directory\n")
    assert parse_sha256sum(text) == {"x-1-py3-none-any.whl": "a" * 64, "InRelease": "b" * 64}


def test_diff_names_what_changed():
    p = PythonVenvProvider()
    base = {"connection": {"host": "h"}, "path": "/root/v", "python": "3.11", "packages": ["a==1"],
            "wheelhouse": {"localDir": "/cache/x", "files": {"a-1-py3-none-any.whl": "1" * 64}, "remoteDir": "/w"}}
    assert not p.diff("id", base, dict(base)).changes
    # Where the wheelhouse sits on the operator's machine is not a change of the host.
    assert not p.diff("id", base, {**base, "wheelhouse": {**base["wheelhouse"], "localDir": "/elsewhere"}}).changes
    assert p.diff("id", base, {**base, "wheelhouse": {**base["wheelhouse"], "files": {"a-1-py3-none-any.whl": "2" * 64}}}).changes
    drift = {**base, "packages": ["a (not installed)"]}
    assert p.diff("id", drift, base).changes
    moved = p.diff("id", base, {**base, "path": "/root/w"})
    assert moved.changes and moved.replaces == ["path"]
