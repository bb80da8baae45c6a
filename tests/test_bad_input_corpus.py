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
import re
from pathlib import Path

import pytest
import yaml

from components.core import flags
from components.core.config import SECTIONS, parse_settings
from components.core.errors import ConfigError, SettingError
from components.core.plan import build_plans, check_stack, plan_stack, stack_names
from components.core.stack_config import RawConfig, _decode, from_files
from components.core.strategy import UNIT_NAME

from . import corpus_support as CS
from . import hardening_support as H

ROOT = Path(__file__).resolve().parent.parent
CORPUS = CS.CORPUS


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


@pytest.mark.parametrize("name,case", CS.refused_cases(), ids=[n for n, _ in CS.refused_cases()])
def test_invalid_configuration_is_refused_naming_the_setting(name, case, tmp_path):
    errors = refused_by_plan(case, tmp_path)
    assert errors, f"{name}: accepted, but {case['why']}"
    expected = case["expect"]
    naming = [e for e in errors if e.setting == expected["setting"]]
    assert naming, f"{name}: no error names {expected['setting']}; got: " + "; ".join(map(str, errors))
    assert any(expected["contains"] in str(e) for e in naming), f"{name}: " + "; ".join(map(str, naming))
    text = str(ConfigError(errors))
    for key in ("hfToken", "sshPrivateKey"):
        secret = (case.get("config") or {}).get(key)
        if isinstance(secret, str):
            # A secret's value is never part of the message that refuses it.
            assert all(secret not in str(e) and secret.split("\n")[0] not in str(e) for e in errors)
    for fragment in expected.get("not_shown", []):
        assert fragment not in text, f"{name}: the message quotes {fragment!r}: {text}"
    # One line per problem, bounded, nothing that would move the cursor or add a line.
    assert len(text) < 4000 and all(line.isprintable() for line in text.splitlines()), text[:4000]
    H.refused(name)


@pytest.mark.parametrize("name,case", CS.accepted_cases(), ids=[n for n, _ in CS.accepted_cases()])
def test_ordinary_configuration_is_accepted(name, case, tmp_path):
    errors = refused_by_plan(case, tmp_path)
    assert not errors, f"{name}: refused, but {case['why']}: " + "; ".join(map(str, errors))


# Classes of hostile input of issue 13: several cases each, each from its own angle.
ISSUE_13_KINDS = ("inject-", "lookalike-", "secret-echo-", "bound-", "hostkey-", "overrefusal-")


def test_corpus_covers_what_issue_8_lists():
    names = [n for n, _ in corpus()]
    assert len(names) >= 40
    for kind in ("arith-", "memory-", "port-", "path-", "served-name-", "env-", "secret-", "unit-", "extra-",
                 "type-", "missing-", "inject-", "lookalike-", "secret-echo-", "bound-", "hostkey-", "overrefusal-"):
        assert sum(n.startswith(kind) for n in names) >= 3 if kind in ISSUE_13_KINDS else 2, kind
    for shell in (";", "$(", "\n", "'", '"', " "):
        assert any(shell in yaml.safe_dump(c["config"]) or shell in str(c["config"]) for _, c in corpus()), shell


# Strings that must never reach a command line or a unit file.
HOSTILE = ["a b", "a;b", "$(id)", "`id`", "a\nb", "a'b", 'a"b', "a\\b", "%h", "a|b", "a&b", "a>b",
           # issue 13: a trailing newline passed every ^...$ pattern; other control characters;
           # digits that are not ASCII; ${} expansion.
           "a\n", "a\r", "a\tb", "a\0", "\x1b[2Ja", "a\u2028b", "\u0661\u0663", "a${HOME}"]
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
            build_plans(settings)
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
                    ("channels.py", "execute"), ("host_lock.py", "acquire")} else None
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


# ---------------------------------------------------------------------------------------------
# Issue 13: every string setting, fed every class of hostile text, is refused by name

# A real ed25519 public key (generated for these tests; a public key, no secret).
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBk5Cd7Ad55IN5VS2Wro6PHRmPTvaG4gJLQZKW5EjmqI"
# A commit a hub: model.source pins (any 40 lower-case hex digits).
PINNED = "0123456789abcdef0123456789abcdef01234567"
# One valid value per text setting: each hostile variant is made from it, and the valid value
# itself must pass (so a refusal is the hostile part's doing). A new text setting must be added
# here: test_every_text_setting_has_a_valid_value says so.
VALID = {
    ("host", "address"): "10.0.0.11", ("host", "rehearsal"): "default", ("host", "user"): "ubuntu",
    ("host", "gpuModel"): "NVIDIA H200", ("host", "interconnect"): "nvlink", ("host", "hostKey"): HOST_KEY,
    ("host", "privateKeyPath"): "/root/.ssh/id_ed25519",
    ("model", "profile"): "kimi-k2.6", ("model", "name"): "kimi-k2.6", ("model", "path"): "/models/kimi-k2.6",
    ("model", "servedName"): "kimi-k2.6",
    ("model", "source"): "verify", ("model", "hubEndpoint"): "http://10.0.0.5:8080",
    ("strategy", "name"): "tp8", ("strategy", "moeA2aBackend"): "none",
    ("strategy", "nodeNetwork"): "tcp", ("strategy", "socketInterface"): "eth0",
    ("serving", "host"): "0.0.0.0", ("serving", "attentionBackend"): "fa3", ("serving", "grammarBackend"): "xgrammar",
    ("serving", "speculativeAlgorithm"): "EAGLE", ("serving", "unitPrefix"): "sglang",
    ("serving", "environmentDir"): "/etc/gpu-serving",
    ("cuda", "version"): "13.0", ("cuda", "home"): "/usr/local/cuda-13.0", ("cuda", "install"): "verify",
    ("cuda", "aptPackage"): "cuda-toolkit-13-0", ("cuda", "keyringSha256"): "0" * 64,
    ("cuda", "aptRepository"): "deb [signed-by=/usr/share/keyrings/cuda.gpg] https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /",  # noqa: E501 - one literal
    ("venv", "path"): "/root/venv_sglang211", ("venv", "python"): "3.12", ("venv", "wheelhouse"): "/srv/wheels",
    ("benchmark", "client"): "rehearsal", ("readiness", "fitness"): "refuse",
}


def _first_choice(annotation):
    import typing
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg)[0]
        choice = _first_choice(arg)
        if choice is not None:
            return choice
    return None


# A choice setting the flag table declares (a new SGLang flag: no edit here) takes its first choice.
for _row in flags.FLAGS:
    if _row.declare is not None and _first_choice(_row.declare[0]) is not None:
        VALID.setdefault((_row.section, _row.key), _first_choice(_row.declare[0]))
# Text in lists and maps: the item each variant replaces, and the setting the refusal names.
LIST_VALID = {("serving", "extraArgs"): ["--log-level", "info"], ("serving", "conflictsWith"): ["pp8"],
              ("venv", "packages"): ["sglang[all]==0.5.23"], ("strategy", "nodes"): ["gpuA", "gpuB"]}
# A lookalike is fine where the text never leaves the operator's machine (see NOT_SENT).
LOOKALIKE_OK = set(NOT_SENT)
# Above every field's own bound and below the 64 KB a whole setting may take (stack_config's
# MAX_VALUE_BYTES refuses a bigger one by its section, see test_a_10_mb_value_yields_a_short_message).
OVERSIZED = 40_000


def _text_annotation(annotation) -> bool:
    import typing
    text = str(annotation)
    return "str" in text or "Literal[" in text or any(_text_annotation(a) for a in typing.get_args(annotation))


def _all_text_settings() -> set[tuple[str, str]]:
    out = set()
    for section, cls in SECTIONS.items():
        for name, f in cls.model_fields.items():
            if _text_annotation(f.annotation):
                out.add((section, f.alias or name))
    return out


def test_every_text_setting_has_a_valid_value():
    known = set(VALID) | set(LIST_VALID) | {("serving", "environment")}
    assert _all_text_settings() == known, _all_text_settings() ^ known


def _lookalike(value: str) -> str:
    """`value` with its first ASCII digit replaced by the Arabic-Indic one (or one added)."""
    for i, c in enumerate(value):
        if c.isdigit():
            return value[:i] + chr(0x0660 + int(c)) + value[i + 1:]
    return value + "\u0663"


def hostile_variants(valid: str) -> dict[str, str]:
    return {
        "trailing newline": valid + "\n", "carriage return": valid + "\r", "tab": valid[:1] + "\t" + valid[1:],
        "NUL": valid + "\0", "escape sequence": "\x1b[2J" + valid, "line separator": valid + "\u2028x",
        "lookalike digit": _lookalike(valid), "oversized": valid + "a" * OVERSIZED,
    }


def _with(base: dict, section: str, key: str, value) -> dict:
    config = {**base, section: {**(base.get(section) or {}), key: value}}
    if section == "model":
        config["model"] = {"profile": "kimi-k2.6", key: value} if key != "profile" else {"profile": value}
    if (section, key) == ("model", "hubEndpoint"):
        # An endpoint is for a hub: source only (model_source.check refuses it beside any other).
        config["model"]["source"] = f"hub:moonshotai/Kimi-K2-Instruct@{PINNED}"
    if (section, key) == ("strategy", "nodes"):
        # A multi-node layout over the two machines it names, TP16 over their 16 GPUs.
        config["strategy"] = {**config["strategy"], "tpSize": 16}
        config["hosts"] = [{"name": n, "address": f"10.0.0.{11 + i}", "hostKey": HOST_KEY} for i, n in enumerate(("gpuA", "gpuB"))]
    return config


def _assert_named_refusal(config: dict, setting: str, label: str):
    errors = validate("tp8", config)  # any exception but ConfigError fails the test: no traceback
    naming = [e for e in errors if e.setting == setting or e.setting.startswith(setting + ".")
              or e.setting.startswith(setting + "[") or e.setting.startswith(setting + " (")]
    assert naming, f"{setting} accepted the {label} variant; errors: " + "; ".join(map(str, errors))[:500]
    text = str(ConfigError(errors))
    assert len(text) < 4000, f"{setting} {label}: a {len(text):,}-character message"
    assert all(line.isprintable() for line in text.splitlines()), f"{setting} {label}: {text!r}"[:500]
    H.refused(f"generated: {setting} {label}")


@pytest.mark.parametrize("section,key", sorted(VALID), ids=lambda x: x)
def test_every_text_setting_refuses_each_class_of_hostile_text_by_name(section, key):
    base = project_config()
    setting = f"gpu-serving:{section}.{key}"
    valid = VALID[(section, key)]
    assert not [e for e in validate("tp8", _with(base, section, key, valid)) if e.setting.startswith(setting)]
    for label, value in hostile_variants(valid).items():
        if label == "lookalike digit" and (section, key) in LOOKALIKE_OK:
            continue
        _assert_named_refusal(_with(base, section, key, value), setting, label)


@pytest.mark.parametrize("section,key", sorted(LIST_VALID), ids=lambda x: x)
def test_every_list_item_refuses_each_class_of_hostile_text_by_name(section, key):
    base = project_config()
    items = LIST_VALID[(section, key)]
    assert not [e for e in validate("tp8", _with(base, section, key, items)) if e.setting.startswith(f"gpu-serving:{section}.{key}")]
    for i, item in enumerate(items):
        for label, value in hostile_variants(item).items():
            hostile = [*items[:i], value, *items[i + 1:]]
            _assert_named_refusal(_with(base, section, key, hostile), f"gpu-serving:{section}.{key}[{i}]", label)


def test_environment_keys_and_values_refuse_each_class_of_hostile_text_by_name():
    base = project_config()
    where = "gpu-serving:serving.environment"
    assert not validate("tp8", _with(base, "serving", "environment", {"NCCL_DEBUG": "INFO1"}))
    for label, value in hostile_variants("NCCL_DEBUG1").items():
        _assert_named_refusal(_with(base, "serving", "environment", {value: "INFO"}), where, f"key {label}")
    for label, value in hostile_variants("INFO1").items():
        _assert_named_refusal(_with(base, "serving", "environment", {"NCCL_DEBUG": value}), f"{where}.NCCL_DEBUG", f"value {label}")


FLEET_VALID = {"name": "gpu1", "address": "10.0.0.11", "user": "ubuntu", "rehearsal": "default", "hostKey": HOST_KEY,
               "privateKeyPath": "/root/.ssh/id_ed25519", "gpuModel": "NVIDIA H200", "interconnect": "pcie"}


def test_fleet_entries_text_settings_are_all_covered():
    from components.core.config import HostEntry
    text = {f.alias or n for n, f in HostEntry.model_fields.items() if _text_annotation(f.annotation)}
    assert text == set(FLEET_VALID), text ^ set(FLEET_VALID)


@pytest.mark.parametrize("key", sorted(FLEET_VALID))
def test_every_fleet_entry_setting_refuses_each_class_of_hostile_text_by_name(key):
    base = project_config()
    entry = {"name": "gpu1", "address": "10.0.0.11", "hostKey": HOST_KEY}
    assert not validate("tp8", {**base, "hosts": [{**entry, key: FLEET_VALID[key]}]})
    for label, value in hostile_variants(FLEET_VALID[key]).items():
        _assert_named_refusal({**base, "hosts": [{**entry, key: value}]}, f"gpu-serving:hosts[0].{key}", label)


def test_a_10_mb_value_yields_a_short_message():
    base = project_config()
    errors = validate("tp8", _with(base, "model", "servedName", "k" * 10_000_000))
    text = str(ConfigError(errors))
    # Refused by the size of the whole setting before its fields are read: named, and short.
    assert [e for e in errors if e.setting in ("gpu-serving:model", "gpu-serving:model.servedName")], text[:2000]
    assert len(text) < 1000 and "10,000,0" in text, text[:2000]


def test_many_problems_yield_a_bounded_message():
    base = project_config()
    env = {f"BAD KEY {i}": "x" for i in range(200)}
    errors = validate("tp8", {**base, "serving": {**base["serving"], "environment": env}})
    assert len(errors) == 200
    text = str(ConfigError(errors))
    assert len(text) < 20_000 and "more" in text.splitlines()[-1], text[-500:]


# ---------------------------------------------------------------------------------------------
# Every pattern in components/: whole-string and ASCII-only

COMPONENTS = ROOT / "components"
_RE_FUNCS = {"compile", "match", "fullmatch", "search", "sub", "subn", "findall", "finditer", "split"}


def _pattern_calls():
    for path in sorted(COMPONENTS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _RE_FUNCS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args):
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    source = first.value
                elif isinstance(first, ast.JoinedStr):
                    source = "".join(v.value for v in first.values if isinstance(v, ast.Constant))
                else:
                    continue
                yield f"{path.relative_to(ROOT)}:{node.lineno}", source, node


def test_every_pattern_matches_whole_strings_in_ascii():
    """`$` matches before a trailing newline, so a `^...$` pattern accepts "value\\n"; `\\d`
    matches any script's digits. Patterns end in \\Z (or are searches that anchor nothing) and
    use explicit ASCII classes, or re.ASCII."""
    problems = []
    for where, source, node in _pattern_calls():
        if source.endswith("$") and not source.endswith("\\$"):
            problems.append(f"{where}: ends in $ (use \\Z and fullmatch)")
        if re.search(r"\\[dwsb]", source, re.IGNORECASE):
            flags = ast.unparse(node)
            if "ASCII" not in flags:
                problems.append(f"{where}: \\d, \\w, \\s or \\b without re.ASCII")
    assert not problems, "\n".join(problems)
    assert sum(1 for _ in _pattern_calls()) > 20  # the audit sees the patterns


def test_a_trailing_newline_never_matches_a_settings_pattern():
    from components.core import config, config_fields, config_hosts, config_serving
    patterns = [v for m in (config, config_fields, config_hosts, config_serving) for v in vars(m).values()
                if isinstance(v, re.Pattern)]
    assert len(patterns) > 15
    for p in patterns:
        assert p.pattern.startswith("\\A") and p.pattern.endswith("\\Z") and p.flags & re.ASCII, p.pattern
