"""Issue 8, point 1 (pure part): a corpus of invalid configurations, each refused before anything
touches a host, by an error that names the setting.

Each file in tests/data/bad-input/ is one configuration: `config` holds what a stack file would
say (sections replace the project's sections of Pulumi.yaml, as Pulumi does), `stack` the stack
name when it matters, `expect.setting` the setting the error must name and `expect.contains`
a phrase of the rule. The check is what `pulumi preview` runs first: the settings (pydantic),
SGLang's rules and the memory plan (`build_plan`), the CUDA source settings. Some of the same
files go through the real `pulumi preview`/`up` against a rehearsal host in
tests/e2e/test_hardening_input.py, which also counts the commands run there (zero).

Also here: no hostile string is accepted by any setting that reaches a host, no setting crashes
the validator, and a static audit of components/remote/ (every remote command is an argv list or
a fixed script, and has a timeout).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from components import cuda as C
from components.config import SECTIONS, parse_settings
from components.errors import ConfigError, SettingError
from components.plan import build_plan, build_plans, check_stack, plan_stack, stack_names
from components.stack_config import RawConfig, _decode, from_files
from components.strategy import UNIT_NAME

from . import corpus_support as CS
from . import hardening_support as H

ROOT = Path(__file__).resolve().parent.parent
CORPUS = CS.CORPUS
SIBLINGS = ["tp8", "pp8", "ep8"]


def project_config() -> dict:
    """The project-level values of Pulumi.yaml, without the namespace, plus tp8's layout."""
    config = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    return {**{k.split(":", 1)[1]: v["value"] for k, v in config.items()}, "strategy": {"tpSize": 8}}


def corpus() -> list[tuple[str, dict]]:
    return CS.cases()


def validate(stack: str, config: dict) -> list[SettingError]:
    """What preview checks before the program registers a single resource: `plan.check_stack`,
    on these settings as the engine would hand them over (this repository's project around them)."""
    raw = RawConfig(values={f"gpu-serving:{k}": v for k, v in config.items()})
    try:
        check_stack(stack, raw, ROOT)
    except ConfigError as exc:
        return exc.errors
    return []


def refused_by_plan(case: dict, base: Path) -> list[SettingError]:
    """The case as files on disk, checked the way `python -m components plan` does; a case with
    `secrets` as the program sees it (plan cannot decrypt what it would check)."""
    project = CS.write_project(base, case)
    stack = CS.stack_of(case)
    try:
        if case.get("secrets"):
            values, secret_keys = CS.engine_config(project, case)
            raw = RawConfig(values={k: _decode(v) if k.split(":", 1)[1] not in case["secrets"] else v
                                    for k, v in values.items()}, secret_keys=set(secret_keys))
        else:
            raw = from_files(project, stack)
        check_stack(stack, raw, project)
    except ConfigError as exc:
        return exc.errors
    return []


@pytest.mark.parametrize("name,case", corpus(), ids=[n for n, _ in corpus()])
def test_invalid_configuration_is_refused_naming_the_setting(name, case, tmp_path):
    errors = refused_by_plan(case, tmp_path)
    assert errors, f"{name}: accepted, but {case['why']}"
    expected = case["expect"]
    naming = [e for e in errors if e.setting == expected["setting"]]
    assert naming, f"{name}: no error names {expected['setting']}; got: " + "; ".join(map(str, errors))
    assert any(expected["contains"] in str(e) for e in naming), f"{name}: " + "; ".join(map(str, naming))
    for key in ("hfToken", "sshPrivateKey"):
        secret = (case.get("config") or {}).get(key)
        if isinstance(secret, str):
            # A secret's value is never part of the message that refuses it.
            assert all(secret not in str(e) and secret.split("\n")[0] not in str(e) for e in errors)
    H.refused(name)


def test_corpus_covers_what_issue_8_lists():
    names = [n for n, _ in corpus()]
    assert len(names) >= 40
    for kind in ("arith-", "memory-", "port-", "path-", "served-name-", "env-", "secret-", "unit-", "extra-",
                 "type-", "missing-"):
        assert sum(n.startswith(kind) for n in names) >= 2, kind
    for shell in (";", "$(", "\n", "'", '"', " "):
        assert any(shell in yaml.safe_dump(c["config"]) or shell in str(c["config"]) for _, c in corpus()), shell


# Strings that must never reach a command line or a unit file.
HOSTILE = ["a b", "a;b", "$(id)", "`id`", "a\nb", "a'b", 'a"b', "a\\b", "%h", "a|b", "a&b", "a>b"]
# Settings that are text but never reach the host: where they go instead.
NOT_SENT = {
    ("venv", "wheelhouse"): "a directory on the operator's machine; the host gets the wheels by SFTP into a fixed directory",
}
# Free text that may hold spaces (a GPU model's name); it is only compared, never sent or rendered.
SPACES_OK = {("host", "gpuModel")}


def test_settings_not_sent_to_the_host_are_still_string_fields():
    # NOT_SENT is left out of the hostile-string test below; it must name real settings.
    fields = set(_string_fields())
    assert set(NOT_SENT) <= fields, set(NOT_SENT) - fields


def _string_fields():
    for section, cls in SECTIONS.items():
        for name, f in cls.model_fields.items():
            annotation = str(f.annotation)
            if "str" in annotation and "dict" not in annotation and "list" not in annotation:
                yield section, f.alias or name


@pytest.mark.parametrize("section,key", [f for f in _string_fields() if f not in NOT_SENT], ids=lambda x: x)
def test_no_hostile_string_is_accepted(section, key):
    base = project_config()
    for value in HOSTILE:
        if value == "a b" and (section, key) in SPACES_OK:
            continue
        config = {**base, section: {**(base.get(section) or {}), key: value}}
        if section == "model":
            config["model"] = {"profile": "kimi-k2.6", key: value}
        errors = validate("tp8", config)
        assert errors, f"{section}.{key} accepted {value!r}"


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_no_hostile_string_is_accepted_in_lists_and_maps(value):
    base = project_config()
    serving = base["serving"]
    for variant in ({"extraArgs": ["--log-level", value]}, {"extraArgs": [f"--log-level={value}"]},
                    {"environment": {"NCCL_ALGO": value}} if value not in ("a b", "a;b", "%h", "a|b", "a&b", "a>b") else None,
                    {"environment": {value: "1"}}, {"conflictsWith": [value]}):
        if variant is None:
            continue  # spaces and ; | & > % are fine inside a quoted EnvironmentFile value
        errors = validate("tp8", {**base, "serving": {**serving, **variant}})
        assert errors, f"serving {variant} accepted"
    assert validate("tp8", {**base, "venv": {**base["venv"], "packages": [f"sglang=={value}"]}})


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_no_hostile_string_is_accepted_in_a_fleet_entry(value):
    base = project_config()
    for key in ("name", "address", "user", "rehearsal", "hostKey", "privateKeyPath"):
        entry = {"name": "gpu1", "address": "10.0.0.11", key: value}
        assert validate("tp8", {**base, "hosts": [entry]}), f"hosts[0].{key} accepted {value!r}"


def test_validator_never_crashes_on_any_value_of_hosts():
    base = project_config()
    for value in [True, None, [], {}, [1], [None], [[]], {"a": 1}, -1, "", 2 ** 70, [{"name": 1}],
                  [{"name": "a", "gpuCount": True}], [{"name": "a"}] * 65]:
        try:
            settings = parse_settings("tp8", {**base, "hosts": value})
            build_plans(settings, SIBLINGS)
        except ConfigError:
            pass


def test_validator_never_crashes_on_any_type():
    """Every setting given every kind of wrong value: a ConfigError, never another exception."""
    values = [True, None, [], {}, [1], {"a": 1}, -1, 0, 1e309, float("nan"), "", 2 ** 70]
    base = project_config()
    for section, cls in SECTIONS.items():
        for name, f in cls.model_fields.items():
            for value in values:
                config = {**base, section: {**(base.get(section) or {}), (f.alias or name): value}}
                validate("tp8", config)  # raises on a crash
        for value in values:
            validate("tp8", {**base, section: value})


def test_shipped_stacks_have_unit_names_systemd_accepts():
    for stack in stack_names(ROOT):
        plan = plan_stack(ROOT, stack)
        for unit in [plan.unit.name, *plan.unit.conflicts]:
            assert UNIT_NAME.match(unit) and len(unit) <= 255 and unit.endswith(".service"), unit


# ---------------------------------------------------------------------------------------------
# Static audit of the code that talks to hosts

REMOTE = ROOT / "components" / "remote"


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            yield name, node


def test_every_remote_command_is_an_argv_list_or_a_fixed_script_and_has_a_timeout():
    """`ssh.run` quotes an argv list with shlex.join; a script (`sh -c SCRIPT sh ARGS...`) must be
    a constant, with the settings passed as its arguments. Every call states its timeout (and
    `run` bounds the whole run by it)."""
    problems = []
    for path in sorted(REMOTE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for name, call in _calls(tree):
            where = f"{path.name}:{call.lineno}"
            if name == "run" and call.args and len(call.args) >= 2:
                argv = call.args[1]
                if isinstance(argv, (ast.JoinedStr, ast.BinOp)) or (isinstance(argv, ast.Call) and
                                                                      getattr(argv.func, "attr", "") == "format"):
                    problems.append(f"{where}: a command built as a string")
                if isinstance(argv, ast.List) and len(argv.elts) >= 3:
                    first, second, script = argv.elts[:3]
                    if (isinstance(first, ast.Constant) and first.value == "sh" and isinstance(second, ast.Constant)
                            and second.value == "-c" and isinstance(script, (ast.JoinedStr, ast.BinOp))):
                        problems.append(f"{where}: a shell script with values formatted into it")
                if not any(k.arg == "timeout" for k in call.keywords):
                    problems.append(f"{where}: no timeout=")
            if name == "exec_command":
                problems.append(f"{where}: exec_command") if (path.name, _enclosing(tree, call)) not in {
                    ("ssh.py", "_exec"), ("providers.py", "_lock")} else None
    assert not problems, "\n".join(problems)


def _enclosing(tree, target) -> str:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(n is target for n in ast.walk(node)):
                best = node.name
                for inner in ast.walk(node):
                    if isinstance(inner, ast.FunctionDef) and inner is not node and any(n is target for n in ast.walk(inner)):
                        best = inner.name
                return best
    return ""
