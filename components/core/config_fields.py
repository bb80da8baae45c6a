"""The field-level rules of the settings: every text setting's bound and pattern, the address,
key, environment and extraArgs checks, the refusal of credentials in plain settings, the base
model every section shares, and pydantic's errors turned into refusals that name the setting.

Every text setting is a `text_setting`: a maximum length checked first (a 10 MB value gets a
short refusal), then a pattern matched against the whole string (`re.fullmatch` with patterns
anchored ``\\A...\\Z``: ``$`` alone would accept a trailing newline) with ASCII-only classes
(``\\d`` would take ``١٣``). Messages quote values only through `errors.shown`.
"""
from __future__ import annotations

import base64
import binascii
import difflib
import ipaddress
import re
import typing
from typing import Annotated, Any, Callable, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from .errors import SettingError, secret_kind, shown
from .rules import ENV_KEY, NAMESPACE, ROUTER_KEY, breaks_secret_line, credential_name
from .rules import rx as _rx


# Characters allowed in anything that ends up on a command line or in a unit file. Paths,
# names and flag values never need shell or systemd metacharacters; refusing them here is what
# lets the renderers and the remote layer stay simple and safe.
SAFE_VALUE = _rx(r"[A-Za-z0-9_./:,+@=-]+")
SAFE_PATH = _rx(r"/[A-Za-z0-9_./+-]*")
SAFE_NAME = _rx(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SAFE_SERVED_NAME = _rx(r"[A-Za-z0-9][A-Za-z0-9_./:-]{0,127}")
FLAG = _rx(r"--[a-z0-9]+(?:-[a-z0-9]+)*(?:=[A-Za-z0-9_./:,+@=-]+)?")
# A negative number is a value (--chunked-prefill-size -1), not a flag.
NUMBER = _rx(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
HOSTNAME = _rx(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
# What an IPv6 zone may be: an interface name (Linux allows up to 15 bytes) or an index.
IPV6_ZONE = _rx(r"[A-Za-z0-9_.-]{1,15}")
HOST_KEY = _rx(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|rsa-sha2-(?:256|512)) ([A-Za-z0-9+/]+={0,2})")
PIP_SPEC = _rx(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+")
CUDA_VERSION = _rx(r"[0-9]{1,2}\.[0-9]{1,2}")
PYTHON_VERSION = _rx(r"3\.[0-9]{1,2}")
USER = _rx(r"[a-z_][a-z0-9_-]{0,31}")
STRATEGY_NAME = _rx(r"[a-z0-9][a-z0-9_-]{0,31}")
UNIT_PREFIX = _rx(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
KEY_FILE = _rx(r"[~/][A-Za-z0-9_./+-]*")
APT_PACKAGE = _rx(r"[a-z0-9][a-z0-9.+-]+(=[A-Za-z0-9.+~:-]+)?")
SHA256 = _rx(r"[0-9a-f]{64}")
# Free text shown in messages only (gpuModel): printable, no shell or systemd metacharacters.
SAFE_TEXT = _rx(r"[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,127}")

# Longest value of each kind (checked before any pattern); lists and maps are bounded too.
MAX_NAME = 64
MAX_SERVED_NAME = 128
MAX_PATH = 1024
MAX_ADDRESS = 253
MAX_HOST_KEY = 8192
MAX_ARG = 1024
MAX_ARGS = 256
MAX_ENV_KEY = 128
MAX_ENV_VALUE = 4096
MAX_ENV = 256
MAX_PACKAGE = 256
MAX_PACKAGES = 128
MAX_CONFLICTS = 64
MAX_APT_LINE = 1024


def _bounded(value: str, limit: int, what: str) -> str:
    if len(value) > limit:
        kind = secret_kind(value[:100_000], generic=False)
        if kind:
            # Pasted key material: say so without echoing a byte of it.
            raise ValueError(f"holds a {len(value):,}-character {kind} (not shown), not a {what}: {_howto(kind)}")
        raise ValueError(f"is {len(value):,} characters long; a {what} has at most {limit:,}")
    return value


def text_setting(limit: int, what: str, pattern: Optional[re.Pattern[str]] = None,
                 *checks: Callable[[str], str]) -> AfterValidator:
    """The check of a str setting (``Annotated[str, text_setting(...)]``): at most `limit`
    characters, matching `pattern` whole, then `checks`. Every text setting is one of these, so
    none is unbounded."""

    def check(value: str) -> str:
        _bounded(value, limit, what)
        kind = secret_kind(value, generic=False)
        if kind:
            # A plain setting sits in clear text in the state, the preview and often the unit.
            raise ValueError(f"holds {shown(value)}: {_howto(kind)}")
        if pattern is not None and not pattern.fullmatch(value):
            raise ValueError(f"{shown(value)} is not a valid {what}")
        for more in checks:
            value = more(value)
        return value
    return AfterValidator(check)

def canonical_path(value: str) -> str:
    """The path `value` means, written without '.', '..', empty segments or a trailing '/'."""
    parts: list[str] = []
    for seg in value.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
        else:
            parts.append(seg)
    return "/" + "/".join(parts)


def canonical(value: str) -> str:
    # /usr/. or /usr//bin would slip past a list of system directories and mean another path.
    if value != "/" and (value.endswith("/") or any(seg in ("", ".", "..") for seg in value.split("/")[1:])):
        raise ValueError(f"{shown(value)} is not written in canonical form (no '.', '..' or empty segments, "
                         f"no trailing '/'): write {shown(canonical_path(value))}")
    return value


Name = Annotated[str, text_setting(MAX_NAME, "name (letters, digits, . _ -)", SAFE_NAME)]
ABS_PATH = "absolute path without spaces, quotes or shell characters"
AbsPath = Annotated[str, text_setting(MAX_PATH, ABS_PATH, SAFE_PATH, canonical)]


def key_file_path(value: str) -> str:
    if secret_kind(value):
        # Pasted key material: say so without echoing a byte of it.
        raise ValueError(f"holds {shown(value)}, not a path: {SSH_KEY_HOWTO}")
    if not KEY_FILE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a valid key file path (absolute or ~/..., no spaces or shell characters)")
    return canonical(value) if value.startswith("/") else value


def _ssh_strings(blob: bytes) -> list[bytes]:
    """An SSH wire-format key (RFC 4253 6.6): length-prefixed strings filling the blob exactly."""
    out: list[bytes] = []
    i = 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise ValueError("cut short")
        n = int.from_bytes(blob[i:i + 4], "big")
        if n > len(blob) - i - 4:
            raise ValueError("cut short")
        out.append(blob[i + 4:i + 4 + n])
        i += 4 + n
    return out


# Key type -> (type name inside the blob, number of strings, curve name).
_KEY_SHAPES: dict[str, tuple[str, int, Optional[bytes]]] = {
    "ssh-ed25519": ("ssh-ed25519", 2, None),
    "ssh-rsa": ("ssh-rsa", 3, None),
    "rsa-sha2-256": ("ssh-rsa", 3, None),
    "rsa-sha2-512": ("ssh-rsa", 3, None),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256", 3, b"nistp256"),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384", 3, b"nistp384"),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521", 3, b"nistp521"),
}
HOST_KEY_HELP = "an SSH public host key line like \"ssh-ed25519 AAAAC3Nza...\" (ssh-keyscan -t ed25519 HOST)"


def host_key_line(value: str) -> str:
    """The key line must be a real key: base64 of an SSH key blob whose own type name is the
    declared type. Checked here, so plan, preview and up refuse it before any SSH."""
    m = HOST_KEY.fullmatch(value)
    if not m:
        raise ValueError(f"{shown(value)} is not {HOST_KEY_HELP}")
    declared, data = m.groups()
    try:
        strings = _ssh_strings(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        raise ValueError(f"the {declared} key's base64 does not decode to an SSH key (corrupt or cut short); "
                         f"copy the whole line again from ssh-keyscan") from None
    inner, count, curve = _KEY_SHAPES[declared]
    if not strings or strings[0] != inner.encode():
        found = shown(strings[0].decode("ascii", "replace")) if strings else "nothing"
        raise ValueError(f"declares {declared} but the key inside is {found}; copy the whole line again from ssh-keyscan")
    if (len(strings) != count or (declared == "ssh-ed25519" and len(strings[1]) != 32)
            or (curve is not None and strings[1] != curve)):
        raise ValueError(f"the {declared} key is malformed (wrong parts or sizes); copy the whole line again from ssh-keyscan")
    return value


def host_address(value: str) -> str:
    host, zone = value.partition("%")[0], value.partition("%")[2]
    if "%" in value:
        # A zone names the interface of a link-local IPv6 address; it reaches ssh's command
        # line, so only an interface name's characters.
        if not IPV6_ZONE.fullmatch(zone):
            raise ValueError(f"the zone of {shown(value)} is not an interface name: after '%' only letters, digits, "
                             "_ . - (at most 15), e.g. fe80::1%eth0")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{shown(value)}: only an IPv6 address takes a %zone") from None
        return value
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not HOSTNAME.fullmatch(value):
        raise ValueError(f"{shown(value)} is neither an IP address nor a host name")
    return value


def bind_address(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{shown(value)} is not an IP address to bind (use 0.0.0.0 or 127.0.0.1)") from None
    if "%" in value:
        raise ValueError(f"{shown(value)}: a scoped address (%zone) cannot be bound by the server; use 0.0.0.0 or ::")
    return value


Address = Annotated[str, text_setting(MAX_ADDRESS, "address", None, host_address)]
HostKeyLine = Annotated[str, text_setting(MAX_HOST_KEY, "SSH public host key", None, host_key_line)]
KeyFilePath = Annotated[str, text_setting(MAX_PATH, "key file path", None, key_file_path)]
BindAddress = Annotated[str, text_setting(64, "IP address to bind", None, bind_address)]


# Directories of the operating system itself: a venv there would be created with --clear.
SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
               "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local", "/usr/local/bin",
               "/usr/sbin", "/var", "/var/lib"}
# Environment keys that hold credentials (rules.credential_name) come only as Pulumi secrets
# (gpu-serving:hfToken), never as plain config that would sit in the state and the preview in clear text.
# Flags whose value is a credential (--api-key, --admin-api-key, --hf-token, ...).
SECRET_FLAG_PARTS = ("token", "secret", "password", "passwd", "credentials")
SECRET_FLAG_SUFFIXES = ("api-key", "access-key", "private-key", "secret-key")
# What a refused credential should become instead.
SECRET_HOWTO = ("a credential goes only as a Pulumi secret, into the 0600 environment file, never the "
                "world-readable unit or the plain settings: pulumi config set --secret gpu-serving:hfToken "
                "(the Hugging Face token, the one serving credential gpu-serving takes)")
SSH_KEY_HOWTO = ("an SSH private key goes only as a Pulumi secret: "
                 "pulumi config set --secret gpu-serving:sshPrivateKey < KEYFILE, or give the key file's path")


def _howto(kind: str) -> str:
    return SSH_KEY_HOWTO if "private key" in kind or "PEM" in kind else SECRET_HOWTO
# apt source options that weaken signature checking.
APT_SAFE_OPTIONS = {"signed-by", "arch"}
# Inside the EnvironmentFile's double quotes these would end the value, escape or expand.
ENV_VALUE_FORBIDDEN = "\"\\$`'"


def _secret_flag(flag: str) -> bool:
    parts = flag.lstrip("-").split("-")
    return any(p in SECRET_FLAG_PARTS for p in parts) or flag.endswith(SECRET_FLAG_SUFFIXES)


def _env_key(key: str) -> str:
    _bounded(key, MAX_ENV_KEY, "variable name")
    if not ENV_KEY.fullmatch(key):
        raise ValueError(f"{shown(key)} is not a valid variable name (letters, digits, _; not starting with a digit)")
    if credential_name(key):
        raise ValueError(f"{key} looks like a credential: plain settings end up in clear text in the state and the "
                         f"preview; {SECRET_HOWTO}")
    return key


def _env_value(value: str) -> str:
    _bounded(value, MAX_ENV_VALUE, "variable's value")
    kind = secret_kind(value, generic=False)
    if kind:
        raise ValueError(f"holds {shown(value)}: {_howto(kind)}")
    if not value.isprintable():
        raise ValueError(f"{shown(value)} contains a control character (a newline would add a line to the environment file)")
    if any(c in value for c in ENV_VALUE_FORBIDDEN):
        raise ValueError(f"{shown(value)} contains a quote, backslash, $ or backtick")
    if not value.isascii():
        raise ValueError(f"{shown(value)} contains non-ASCII characters (a lookalike digit or letter reaches the "
                         "server as something else); environment values are ASCII")
    return value


def _env_input(value: Any) -> Any:
    # YAML turns NCCL_IB_DISABLE: 1 into an int; the environment is text.
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    return value


EnvKey = Annotated[str, AfterValidator(_env_key)]
EnvValue = Annotated[str, BeforeValidator(_env_input), AfterValidator(_env_value)]


def _extra_arg(arg: str) -> str:
    _bounded(arg, MAX_ARG, "command-line argument")
    kind = secret_kind(arg, generic=False)
    if kind:
        raise ValueError(f"holds {shown(arg)}: {_howto(kind)}")
    if arg.startswith("-") and not NUMBER.fullmatch(arg):
        if not FLAG.fullmatch(arg):
            raise ValueError(f"{shown(arg)} is not a --long-flag (lower-case, digits, dashes; a negative number is a value)")
        if _secret_flag(arg.split("=", 1)[0]):
            raise ValueError(f"{arg.split('=', 1)[0]} takes a credential: {SECRET_HOWTO}")
    elif not SAFE_VALUE.fullmatch(arg):
        raise ValueError(f"{shown(arg)} contains characters that are not allowed (spaces, quotes, control, shell or "
                         "systemd metacharacters; letters, digits and _ . / : , + @ = - are)")
    return arg


ExtraArg = Annotated[str, AfterValidator(_extra_arg)]


def _pip_spec(spec: str) -> str:
    if not PIP_SPEC.fullmatch(spec):
        raise ValueError(f"{shown(spec)} must be pinned as name==version (an unpinned one would make `up` non-repeatable)")
    return spec


PipSpec = Annotated[str, text_setting(MAX_PACKAGE, "requirement", None, _pip_spec)]


def _is_numeric(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    return any(a in (int, float) for a in typing.get_args(annotation))


def check_secret_value(key: str, value: Any) -> list[SettingError]:
    """A secret's shape, checked without ever putting its value into the message."""
    where = f"{NAMESPACE}:{key}"
    if value is None:
        return []
    if not isinstance(value, str):
        return [SettingError(where, f"must be a string (got {type(value).__name__})")]
    if key == "hfToken":
        if breaks_secret_line(value):
            return [SettingError(where, "contains whitespace, a quote, a backslash, $ or a backtick (a token never does)",
                                 "paste the token alone: pulumi config set --secret gpu-serving:hfToken")]
    if key == "routerAdminKey" and not ROUTER_KEY.fullmatch(value):
        return [SettingError(where, f"a {len(value):,}-character key; the router's admin key must be 16 to 256 of "
                                    "A-Z a-z 0-9 . _ ~ + / = - (smg reads it inside 'id:name:role:key')",
                             "e.g. pulumi config set --secret gpu-serving:routerAdminKey \"$(openssl rand -hex 32)\"")]
    return []


class Settings(BaseModel):
    """Base: camelCase keys as users write them, unknown keys refused (a typo is an error)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
        strict=False,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true as 1: `tpSize: true` would deploy TP1 without a word.
        if (isinstance(value, bool) and info.field_name is not None
                and _is_numeric(cls.model_fields[info.field_name].annotation)):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value


def setting_path(section: str, loc: tuple[int | str, ...]) -> str:
    """The setting a pydantic error location names: gpu-serving:section.key[2].key."""
    path = f"{NAMESPACE}:{section}"
    for part in loc:
        if part == "[key]":
            path += " (the name)"  # pydantic's mark for a map's key: the key itself is refused
        else:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _suggest(model: type[BaseModel], key: str) -> str:
    fields = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(key, fields, n=1) if len(key) <= MAX_NAME else []
    return f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(fields)}"


def validation_errors(section: str, exc: ValidationError, model: type[BaseModel],
                      where: Optional[Callable[[tuple[int | str, ...]], str]] = None) -> list[SettingError]:
    """pydantic's errors for `model` (the settings of `section`) as SettingErrors; `where(loc)`
    names the setting (default: section.loc); an unknown key gets the closest known one."""
    name = where or (lambda loc: setting_path(section, loc))
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            out.append(SettingError(name(loc), "unknown key", _suggest(model, str(loc[-1]))))
        elif err["type"] == "missing":
            fix = "set it in the stack file or pick a model profile" if section == "model" else ""
            out.append(SettingError(name(loc), "is required", fix))
        else:
            out.append(SettingError(name(loc), err["msg"].removeprefix("Value error, ")))
    return out
