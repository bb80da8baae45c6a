"""Issue 13.6 / 12.8: ONE check for `python -m components plan` and the program (preview, up).

Every case of the bad-input corpus goes both ways: as files on disk through `plan` (exit 2), and as
the config the engine would hand the program (every key, secrets decrypted) through the program
under Pulumi's mocks (pulumi.RunError, no resource registered). The two messages must be the
same text. tests/integration/test_one_check_engine.py shows the same through the real engine.
"""
from __future__ import annotations

import os
from pathlib import Path

import pulumi
import pytest
import yaml

from components.__main__ import main as components_main
from components.core.errors import ConfigError
from components.core.stack_config import MAX_FILE_BYTES, from_files, read_yaml

from . import corpus_support as CS

ROOT = CS.ROOT


class Recorder(pulumi.runtime.Mocks):
    def __init__(self):
        self.resources = []

    def new_resource(self, args):
        self.resources.append((args.typ, args.name))
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args):
        return {}


def plan_refusal(project: Path, stack: str, capsys) -> tuple[int, str]:
    rc = components_main(["plan", "--stack", stack, "--project-dir", str(project)])
    err = capsys.readouterr().err
    return rc, err.removeprefix("error: ").rstrip("\n")


def program_refusal(project: Path, stack: str, config: dict, secret_keys: list[str]) -> tuple[str, list]:
    """The program run as preview runs it, in the project's directory, on the engine's config."""
    from components.program import run
    rec = Recorder()
    pulumi.runtime.set_mocks(rec, project="gpu-serving", stack=stack, preview=True)
    pulumi.runtime.set_all_config(config, secret_keys)
    cwd = os.getcwd()
    os.chdir(project)
    try:
        with pytest.raises(pulumi.RunError) as info:
            run()
    finally:
        os.chdir(cwd)
        pulumi.runtime.set_all_config({}, [])
    return str(info.value), [r for r in rec.resources if r[0].startswith(("gpu-serving:", "pulumi-python:"))]


@pytest.mark.parametrize("name,case", CS.refused_cases(), ids=[n for n, _ in CS.refused_cases()])
def test_plan_and_program_refuse_with_the_same_message(name, case, tmp_path, capsys):
    project = CS.write_project(tmp_path, case)
    stack = CS.stack_of(case)
    setting, phrase = case["expect"]["setting"], case["expect"]["contains"]
    rc, plan_message = plan_refusal(project, stack, capsys)
    try:
        from_files(project, stack)
    except ConfigError:
        # The file itself cannot be read as settings: Pulumi reads it before our program runs,
        # so only plan's refusal exists, naming the file.
        assert rc == 2 and setting in plan_message and phrase in plan_message, plan_message
        assert setting.split(":")[0].startswith("Pulumi.") or "written twice" in plan_message, plan_message
        return
    config, secret_keys = CS.engine_config(project, case)
    program_message, registered = program_refusal(project, stack, config, secret_keys)
    assert not registered, registered
    assert setting in program_message and phrase in program_message, program_message
    assert "Traceback" not in program_message
    if case.get("secrets"):
        # plan never decrypts: it accepts what only the decrypted value shows, saying it is secret.
        assert rc == 0, plan_message
        return
    assert rc == 2
    assert program_message == plan_message


# ---------------------------------------------------------------------------------------------
# Secrets as `pulumi config set --secret` writes them (13.4): plan works on such a stack

SECURE = {"secure": "v1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}


def project_with(tmp_path: Path, stack_config: dict, project_config: dict | None = None) -> Path:
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    doc["config"].update(project_config or {})
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "Pulumi.tp8.yaml").write_text(yaml.safe_dump({"encryptionsalt": "v1:abc", "config": stack_config}))
    return tmp_path


def test_plan_works_on_a_stack_with_encrypted_secrets(tmp_path, capsys):
    project = project_with(tmp_path, {"gpu-serving:strategy": {"tpSize": 8}, "gpu-serving:hfToken": SECURE,
                                      "gpu-serving:sshPrivateKey": SECURE},
                           {"gpu-serving:hfToken": {"type": "string", "secret": True}})
    assert components_main(["plan", "--stack", "tp8", "--project-dir", str(project)]) == 0
    out = capsys.readouterr().out
    assert "gpu-serving:hfToken (secret, not shown): HF_TOKEN in /etc/gpu-serving/kimi-k2.6.env" in out
    assert "gpu-serving:sshPrivateKey (secret, not shown)" in out
    assert "v1:AAAA" not in out
    assert components_main(["plan", "--stack", "tp8", "--json", "--project-dir", str(project)]) == 0
    import json
    assert json.loads(capsys.readouterr().out)["secrets"] == {"gpu-serving:hfToken": "(secret, not shown)",
                                                             "gpu-serving:sshPrivateKey": "(secret, not shown)"}


def test_program_takes_a_secret_token_and_refuses_it_in_clear(tmp_path):
    project = project_with(tmp_path, {"gpu-serving:strategy": {"tpSize": 8}})
    base, _ = CS.engine_config(project, {"stack": "tp8", "config": {}})
    token = "hf_" + "x" * 30
    rec = Recorder()
    pulumi.runtime.set_mocks(rec, project="gpu-serving", stack="tp8", preview=True)
    pulumi.runtime.set_all_config({**base, "gpu-serving:hfToken": token}, ["gpu-serving:hfToken"])
    cwd = os.getcwd()
    os.chdir(project)
    try:
        from components.program import run
        run()  # accepted: the token is a secret
        message, _ = program_refusal(project, "tp8", {**base, "gpu-serving:hfToken": token}, [])
    finally:
        os.chdir(cwd)
    assert "pulumi config set --secret gpu-serving:hfToken --stack tp8" in message and token not in message


# ---------------------------------------------------------------------------------------------
# Bounded reading (13.8)

def test_a_file_too_large_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "Pulumi.big.yaml"
    path.write_text("config:\n  gpu-serving:model:\n    servedName: " + "a" * MAX_FILE_BYTES + "\n")
    with pytest.raises(ConfigError, match="a settings file is at most") as info:
        read_yaml(path)
    assert len(str(info.value)) < 400


def test_deep_nesting_is_a_refusal_not_a_recursion_error(tmp_path):
    path = tmp_path / "Pulumi.deep.yaml"
    path.write_text("config:\n  gpu-serving:serving: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(ConfigError, match="nests values too deeply|expands to more than"):
        read_yaml(path)


def test_stack_files_are_read_by_libyaml_and_a_bad_one_is_named_with_its_line(tmp_path):
    # Every program run reads every stack file of the project: libyaml's parser (in the pinned
    # PyYAML wheel) is ~6x faster than the pure-Python one, and refuses the same way.
    from components.core import stack_config

    assert yaml.__with_libyaml__ and issubclass(stack_config._BoundedLoader, yaml.CSafeLoader)
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text("config:\n  gpu-serving:strategy:\n    tpSize: [8\n  other: 1\n")
    with pytest.raises(ConfigError, match=r"Pulumi.bad.yaml: is not valid YAML \(line \d+, column \d+\)"):
        read_yaml(path)
    dup = tmp_path / "Pulumi.dup.yaml"
    dup.write_text("config:\n  gpu-serving:strategy: {tpSize: 8}\n  gpu-serving:strategy: {tpSize: 4}\n")
    with pytest.raises(ConfigError, match="writes the key 'gpu-serving:strategy' twice"):
        read_yaml(dup)


def test_a_shared_alias_within_the_bound_is_read(tmp_path):
    path = tmp_path / "Pulumi.ok.yaml"
    path.write_text("common: &c {gpuCount: 8}\nconfig:\n  gpu-serving:host: *c\n  other: [*c, *c]\n")
    assert read_yaml(path)["config"]["gpu-serving:host"] == {"gpuCount": 8}


def test_alias_bomb_plan_prints_a_short_message(tmp_path, capsys):
    case = yaml.safe_load((CS.CORPUS / "yaml-alias-bomb-in-profile.yaml").read_text())
    project = CS.write_project(tmp_path, case)
    rc, message = plan_refusal(project, "bad", capsys)
    assert rc == 2 and len(message) < 300, message


def test_many_problems_print_a_bounded_message(tmp_path, capsys):
    hosts = [{"name": f"h{i}", "address": f"10.0.0.{i}", "user": "bad user " + "x" * 400} for i in range(60)]
    project = project_with(tmp_path, {"gpu-serving:strategy": {"tpSize": 8}, "gpu-serving:hosts": hosts})
    rc, message = plan_refusal(project, "tp8", capsys)
    assert rc == 2
    assert "(60 problems)" in message and "... and 40 more" in message, message[-500:]
    assert len(message) <= 8100
