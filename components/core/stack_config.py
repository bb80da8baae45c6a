"""Where a stack's settings come from, read into one shape for one check.

Two readers give the same `RawConfig`:

- `from_files`: what ``python -m components plan`` reads, Pulumi.yaml and Pulumi.<stack>.yaml,
  merged the way Pulumi merges them (a stack value replaces the project value of the same key);
- `from_engine`: what the program gets under ``pulumi preview``/``up``: every config key the
  engine hands over (not only the ones the program knows, so a misspelled key is seen), and
  which of them are secrets.

`namespace_settings` then turns either into the sections `config.parse_settings` takes, refusing
by name what would otherwise crash, be ignored, or leak: keys that are not text, keys of a
misspelled namespace, a key written twice, credentials in clear text, secrets where only plain
settings are read, values too large to be settings. Plan and program run the same function on
the same shape, so they refuse the same settings with the same message.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from .config import CONFIG_KEYS, NAMESPACE, SECRET_KEYS
from .errors import ConfigError, SettingError
from .pulumi_yaml import KeyNotText, PulumiLoader, go_key_text

# Bounds on what is read. A stack file of this project is a few KB (a 64-host fleet about 20 KB,
# an encrypted SSH key about 5 KB); anything far larger is a mistake or an attack, and reading
# it whole would only make a larger error message.
MAX_FILE_BYTES = 256 * 1024
# YAML aliases (*name) are allowed, bounded: a node is counted once per use, so a few lines of
# nested aliases (a "billion laughs" file) cannot expand into megabytes of settings. 10,000
# values is some 20 times a large fleet.
MAX_VALUES = 10_000
# One setting's value, as JSON (the form the engine hands it to the program).
MAX_VALUE_BYTES = 64 * 1024
# Keys of the long form of a project-level config value in Pulumi.yaml.
SCHEMA_KEYS = {"type", "description", "default", "value", "secret", "items"}


class SecretValue:
    """A value the stack file holds encrypted (``{secure: v1:...}``): `plan` never decrypts it."""

    def __repr__(self) -> str:
        return "(secret, not shown)"


SECRET = SecretValue()


@dataclass
class RawConfig:
    """Every config key as written (``gpu-serving:serving``), its value as the program sees it."""

    values: dict[Any, Any] = field(default_factory=dict)
    secret_keys: set[str] = field(default_factory=set)
    # Where each key was written, for messages about the key itself ("Pulumi.tp8.yaml").
    origin: dict[Any, str] = field(default_factory=dict)
    # "files" (plan and the other commands) or "engine" (the program under preview and up).
    source: str = "files"


# ---------------------------------------------------------------------------------------------
# Files

class _BoundedLoader(PulumiLoader):
    """The file read as Pulumi reads it (pulumi_yaml: YAML 1.2's core schema as go-yaml v3 resolves
    it, not PyYAML's YAML 1.1), refusing a document whose aliases expand past MAX_VALUES values.
    libyaml's parser when PyYAML has it (its wheels do): a program run reads every stack file of
    the project (which strategy another stack owns), ~6x faster than the pure-Python parser."""

    def get_single_node(self) -> Optional[yaml.Node]:
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node)
        return node


class _TooLarge(Exception):
    """A document refused before it is built: too large once expanded, or ambiguous."""


def _expanded_size(root: yaml.Node) -> int:
    """Values in the document with every alias expanded; stops (raises) past MAX_VALUES. Shared
    nodes are sized once (memo), so the count itself stays cheap for any file."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _TooLarge("an alias refers to a value that contains it (a value without end)")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in node.value:
                # PyYAML keeps the last of two equal keys, Pulumi's reader refuses the file: refused
                # here too, so plan never shows a value the engine would not read. go-yaml compares
                # keys as written (`on` and "on" are one key, and so are 1 and "1").
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen:
                        raise _TooLarge(f"writes the key {k.value[:100]!r} twice in one mapping "
                                        f"(line {k.start_mark.line + 1}); keep one")
                    seen.add(k.value)
                total += size(k) + size(v)
        elif isinstance(node, yaml.SequenceNode):
            for v in node.value:
                total += size(v)
        open_nodes.discard(key)
        if total > MAX_VALUES:
            raise _TooLarge(f"expands to more than {MAX_VALUES:,} values (YAML aliases are counted once per use); "
                            "write the values out, or share fewer of them by alias")
        sizes[key] = total
        return total

    return size(root)


def read_yaml(path: Path) -> Any:
    """One YAML file, bounded in size and expansion; a `ConfigError` naming the file otherwise."""
    name = path.name
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError([SettingError(name, f"is {size:,} bytes; a settings file is at most {MAX_FILE_BYTES:,}",
                                            "a stack file holds settings only; check it is the file you meant")])
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError([SettingError(name, "is not UTF-8 text")]) from None
    except OSError as exc:
        raise ConfigError([SettingError(name, f"cannot be read: {exc.strerror}")]) from None
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except _TooLarge as exc:
        raise ConfigError([SettingError(name, str(exc))]) from None
    except RecursionError:
        raise ConfigError([SettingError(name, "nests values too deeply to be settings")]) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise ConfigError([SettingError(name, f"is not valid YAML{at}: {str(problem)[:200]}")]) from None


def _config_block(path: Path, doc: Any) -> dict[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError([SettingError(path.name, f"must be a YAML mapping (name:, config:, ...), got {_kind(doc)}")])
    block = doc.get("config")
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise ConfigError([SettingError(f"{path.name}: config", f"must be a mapping of settings, got {_kind(block)}",
                                        f"write e.g. config: {{{NAMESPACE}:strategy: {{tpSize: 8}}}}")])
    return block


def _is_secure(value: Any) -> bool:
    """Pulumi's encrypted form, anywhere inside a value (pulumi config set --secret [--path])."""
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            return True
        return any(_is_secure(v) for v in value.values())
    if isinstance(value, list):
        return any(_is_secure(v) for v in value)
    return False


def _engine_form(value: Any) -> Any:
    """A YAML value as the engine hands it to the program (JSON): keys as text (the loader has
    made dates, floats and binary values what the program gets)."""
    if isinstance(value, dict):
        return {_key_text(k): _engine_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_engine_form(v) for v in value]
    return value


def _key_text(key: Any) -> str:
    # Pulumi names a key that is not text as Go prints it (`true`, `1`, `<nil>`): the loader has.
    return str(key) if isinstance(key, str) else go_key_text(key)


def _project_value(spec: Any) -> tuple[bool, Any]:
    """(is set, value) of one Pulumi.yaml entry: short form, or the long form's value/default."""
    if isinstance(spec, dict) and spec and set(spec) <= SCHEMA_KEYS:
        if "value" in spec:
            return True, spec["value"]
        if "default" in spec:
            return True, spec["default"]
        return False, None  # a declaration only (type, description, secret: true)
    return True, spec


def from_files(project_dir: Path, stack: str) -> RawConfig:
    """Pulumi.yaml's config, then Pulumi.<stack>.yaml's over it."""
    project_dir = Path(project_dir)
    project_file = project_dir / "Pulumi.yaml"
    stack_file = project_dir / f"Pulumi.{stack}.yaml"
    if not project_file.exists():
        raise ConfigError([SettingError("Pulumi.yaml", f"not found in {project_dir}")])
    if not stack_file.exists():
        known = ", ".join(stack_names(project_dir)) or "none"
        raise ConfigError([SettingError(f"--stack {stack}", f"no Pulumi.{stack}.yaml in {project_dir}", f"known stacks: {known}")])
    raw = RawConfig()
    errors: list[SettingError] = []
    for key, spec in _config_block(project_file, read_yaml(project_file)).items():
        is_set, value = _project_value(spec)
        if is_set:
            _put(raw, key, value, "Pulumi.yaml", errors)
    for key, value in _config_block(stack_file, read_yaml(stack_file)).items():
        _put(raw, key, value, stack_file.name, errors)
    if errors:
        raise ConfigError(errors, f"stack {stack}")
    return raw


def project_settings(project_dir: Path) -> dict[str, Any]:
    """Pulumi.yaml's own gpu-serving settings by name (what every stack of the project shares);
    {} when there is none or it cannot be read: the stack's own check says why."""
    project_file = Path(project_dir) / "Pulumi.yaml"
    if not project_file.exists():
        return {}
    try:
        block = _config_block(project_file, read_yaml(project_file))
    except ConfigError:
        return {}
    out: dict[str, Any] = {}
    for key, spec in block.items():
        is_set, value = _project_value(spec)
        if is_set and isinstance(key, str) and parse_key(key)[0] == NAMESPACE and not _is_secure(value):
            out[parse_key(key)[1]] = _decode(value) if isinstance(value, str) else _engine_form(value)
    return out


def _put(raw: RawConfig, key: Any, value: Any, origin: str, errors: list[SettingError]) -> None:
    # Keys Pulumi itself cannot read are refused here, naming the file: the engine would stop on
    # them before the program runs (`namespace_settings` says the same if one ever gets through).
    problem = _key_problem(key, origin)
    if problem:
        errors.append(problem)
        return
    if isinstance(key, str):
        ns, name = parse_key(key)
        if ns == NAMESPACE:
            written = key
            key = f"{ns}:{name}"  # gpu-serving:config:x is gpu-serving:x (Pulumi's old form)
            if raw.origin.get(key) == origin:
                errors.append(SettingError(key, f"is written twice in {origin} (the second time as {written!r})", "keep one"))
                return
    secure = _is_secure(value)
    if secure:
        raw.secret_keys.add(key)
        raw.values[key] = SECRET
    else:
        raw.secret_keys.discard(key)
        # A text value is read as the program reads it (JSON where it is JSON: "13.0" is 13.0).
        credential = key in {f"{NAMESPACE}:{k}" for k in SECRET_KEYS}
        raw.values[key] = _decode(value) if isinstance(value, str) and not credential else _engine_form(value)
    raw.origin[key] = origin


def stack_names(project_dir: Path) -> list[str]:
    """Strategies of this project: one per Pulumi.<stack>.yaml file."""
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in Path(project_dir).glob("Pulumi.*.yaml"))


# ---------------------------------------------------------------------------------------------
# The engine

def _decode(value: Any) -> Any:
    """pulumi.Config.get_object's reading: JSON where the text is JSON, else the text itself."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def from_engine(values: dict[str, Any], secret_keys: set[str]) -> RawConfig:
    """Every config key of the running program, as the engine passes them (components/program.py
    reads them from the SDK: PULUMI_CONFIG, or pulumi.runtime.set_all_config under mocks), and
    which are secrets."""
    raw = RawConfig(source="engine")
    credentials = {f"{NAMESPACE}:{k}" for k in SECRET_KEYS}
    for key, value in values.items():
        # A credential is text as given (pulumi.Config.get_secret), never read as JSON.
        raw.values[key] = value if key in credentials else _decode(value)
        raw.origin[key] = "the stack's config"
        if key in secret_keys:
            raw.secret_keys.add(key)
    return raw


# ---------------------------------------------------------------------------------------------
# One reading of the namespace, for both

def parse_key(key: str) -> tuple[str, str]:
    """(namespace, name) as Pulumi parses a config key; ("", "") when it is not one."""
    ns, sep, name = key.partition(":")
    if not sep:
        return NAMESPACE, key  # no namespace: the project's name (gpu-serving) is the namespace
    if name.startswith("config:"):
        name = name[len("config:"):]
    if not ns or not name or ":" in name:
        return "", ""
    return ns, name


def _kind(value: Any) -> str:
    if isinstance(value, KeyNotText):
        return value.kind
    return {dict: "a mapping", list: "a list", str: "text", bool: "true/false", int: "a number",
            float: "a number", type(None): "nothing (null)"}.get(type(value), type(value).__name__)


def _count_values(value: Any, limit: int) -> int:
    count, stack = 0, [value]
    while stack and count <= limit:
        v = stack.pop()
        count += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return count


def _key_problem(key: Any, origin: str) -> SettingError | None:
    if not isinstance(key, str) or isinstance(key, KeyNotText):
        return SettingError(f"{origin}: key {_key_text(key)}", f"is {_kind(key)}, not a setting name",
                            f"settings are written {NAMESPACE}:<setting>, e.g. {NAMESPACE}:serving")
    if not parse_key(key)[0]:
        return SettingError(f"{origin}: key {key!r}"[:200], "is not a configuration key (Pulumi reads <namespace>:<name>)",
                            f"write {NAMESPACE}:{key}" if key in CONFIG_KEYS or key in SECRET_KEYS
                            else f"settings are {', '.join(NAMESPACE + ':' + s for s in CONFIG_KEYS)}")
    return None


def namespace_settings(raw: RawConfig, stack: str) -> tuple[dict[str, Any], list[str], list[SettingError]]:
    """(the gpu-serving settings by name, for `parse_settings`; the secret settings given; errors).

    Secret settings in clear text are refused and not passed on; a secret the stack file holds
    encrypted is reported as given (`plan` does not need its value)."""
    out: dict[str, Any] = {}
    secrets: list[str] = []
    errors: list[SettingError] = []
    written_as: dict[str, Any] = {}
    total = 0
    for key, value in raw.values.items():
        problem = _key_problem(key, raw.origin.get(key, "config"))
        if problem:
            errors.append(problem)
            continue
        ns, name = parse_key(key)
        if ns != NAMESPACE:
            # Other packages' settings (pulumi:tags, ...) are not ours to judge; a namespace that
            # is a slip of ours would silently deploy the defaults instead.
            if difflib.get_close_matches(ns.lower(), [NAMESPACE], n=1, cutoff=0.75):
                errors.append(SettingError(key[:200], f"namespace {ns!r} is not {NAMESPACE!r}: this setting would be ignored",
                                           f"write {NAMESPACE}:{name}"))
            continue
        where = f"{NAMESPACE}:{name}"
        if name in written_as:
            errors.append(SettingError(where, f"is written twice ({written_as[name]!r} and {key!r})", "keep one"))
            continue
        written_as[name] = key
        secret = key in raw.secret_keys
        if name in SECRET_KEYS:
            if value is None or value == "":
                continue
            if not secret:
                source = " < ~/.ssh/id_ed25519" if name == "sshPrivateKey" else ""
                errors.append(SettingError(
                    where, "is set in clear text: a credential must be a Pulumi secret (encrypted in the stack file, "
                    "hidden in the preview and the state)",
                    f"remove it from Pulumi.yaml / Pulumi.{stack}.yaml and run: "
                    f"pulumi config set --secret {where} --stack {stack}{source}"))
                continue
            secrets.append(name)
            if not isinstance(value, SecretValue):
                out[name] = value  # the program has the decrypted value: its shape is checked
            continue
        if secret:
            errors.append(SettingError(
                where, "is set as a secret, but only gpu-serving:hfToken, gpu-serving:sshPrivateKey and gpu-serving:routerAdminKey "
                "are read as secrets: this setting goes into the unit, the state and the preview in clear text",
                f"set it without --secret; a credential goes to {NAMESPACE}:hfToken"))
            continue
        if value is None or value == "":
            # The engine hands a key left empty (null) to the program as "": the same refusal.
            errors.append(SettingError(where, "is empty", "give its settings, or remove the key to use the defaults"))
            continue
        size = len(json.dumps(value, default=str))
        total += size
        if size > MAX_VALUE_BYTES:
            errors.append(SettingError(where, f"is {size:,} bytes; a setting is at most {MAX_VALUE_BYTES:,}"))
            continue
        if _count_values(value, MAX_VALUES) > MAX_VALUES:
            errors.append(SettingError(where, f"holds more than {MAX_VALUES:,} values"))
            continue
        out[name] = value
    return out, secrets, errors
