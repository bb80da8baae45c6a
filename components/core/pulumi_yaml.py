"""Stack files read as Pulumi reads them, so `plan`, `status`, `watch` and `advise` see the values
the program gets under `pulumi preview` and `up` (issue 36.13).

Pulumi (3.274) reads Pulumi.yaml and Pulumi.<stack>.yaml with go-yaml v3 into untyped values
(sdk/go/common/encoding/marshal.go, resource/config/object.go) and hands each setting to the
program as JSON. go-yaml v3 resolves plain scalars by YAML 1.2's core schema, with go-yaml's own
readings of numbers (resolve.go); PyYAML's safe loader is YAML 1.1, which reads `on`, `off`,
`yes`, `no` as booleans and `1:20` as 80. A YAML 1.2 library (ruamel.yaml) would still differ from
go-yaml on `017`, `1_000`, `1e3` and dates, so the loader below is PyYAML's (libyaml's parser,
which go-yaml is a port of) with go-yaml v3's resolution, value by value:

- `true`/`True`/`TRUE`, `false`/...: booleans; `~`, `null`/`Null`/`NULL`, nothing: null; every other
  word (`on`, `off`, `yes`, `no`, `y`, `n`, ...) is text;
- a scalar starting with a digit or sign: a date (`2024-01-02`, `2024-01-02T10:00:00Z`, ...) when
  it is one, handed over as Go prints a time (`2024-01-02 00:00:00 +0000 UTC`); else an integer
  as Go's strconv.ParseInt(s, 0, 64) reads it once `_` are removed (`0x1F`, `0o17`, `017` octal,
  `0b101`), or a float (`1e3`, `-.5`, `08`); else text (`1:20`, `1.2.3`);
- `.5`, `.inf`, `.nan`: floats; quoted and block scalars: always text;
- a float goes to the program as JSON, as Go writes it: an integral one is an integer there
  (`1e3` is 1000); NaN and infinities cannot be written, and Pulumi refuses the file;
- a key that is not text is named as Go's `%v` prints it (`true`, `1`, `<nil>`, `1e+06`).

Quoted and explicitly tagged scalars resolve as go-yaml resolves them (`!!bool yes` is an error);
tags go-yaml does not know are ignored (the value as written).
"""
from __future__ import annotations

import base64
import binascii
import calendar
import math
import re
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Optional

import yaml

Y = "tag:yaml.org,2002:"
STR, BOOL, NULL, INT, FLOAT, TIMESTAMP, MERGE = (Y + t for t in ("str", "bool", "null", "int", "float", "timestamp", "merge"))
RESOLVED = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False,
            "": None, "~": None, "null": None, "Null": None, "NULL": None,
            ".nan": math.nan, ".NaN": math.nan, ".NAN": math.nan,
            ".inf": math.inf, ".Inf": math.inf, ".INF": math.inf, "+.inf": math.inf, "+.Inf": math.inf,
            "+.INF": math.inf, "-.inf": -math.inf, "-.Inf": -math.inf, "-.INF": -math.inf}
# go-yaml's yamlStyleFloat, and what strconv.ParseFloat takes of a scalar starting with "."
GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z", re.ASCII)
DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?\Z", re.ASCII)
DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}
# go-yaml's allowedTimestampFormats: 2006-1-2T15:4:5.999999999Z07:00 (also with t), 2006-1-2 15:4:5.999999999, 2006-1-2
# (a time needs a zone after T or t, and none after a space; any digits of a second's fraction)
TIMESTAMP_RE = re.compile(r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{1,2})-(?P<d>[0-9]{1,2})"
                          r"(?:(?P<sep>[Tt ])(?P<h>[0-9]{1,2}):(?P<mi>[0-9]{1,2}):(?P<s>[0-9]{1,2})(?:[.,](?P<f>[0-9]+))?"
                          r"(?P<z>Z|[-+][0-9]{2}:[0-9]{2})?)?\Z", re.ASCII)
INT64 = 1 << 63
# A float Go's encoding/json writes with an exponent (and Python then reads as a float).
JSON_FLOAT_FROM = 1e21


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64), else ParseUint(text, 0, 64): None when neither reads it."""
    sign, body = 1, text
    if body[:1] in ("+", "-"):
        sign, body = (-1 if body[0] == "-" else 1), body[1:]
    base, digits = 10, body
    if body[:2] in ("0x", "0X"):
        base, digits = 16, body[2:]
    elif body[:2] in ("0o", "0O"):
        base, digits = 8, body[2:]
    elif body[:2] in ("0b", "0B"):
        base, digits = 2, body[2:]
    elif len(body) > 1 and body[0] == "0":
        base, digits = 8, body[1:]
    if not digits or any(c not in DIGITS[base] for c in digits):
        return None
    value = sign * int(digits, base)
    if -INT64 <= value < INT64 or (text[:1] not in ("+", "-") and value < 2 * INT64):
        return value
    return None


def _as_program_sees(value: float) -> int | float:
    """A float as the program reads it: Go's encoding/json writes an integral float below 1e21
    without a point, so json.loads makes it an integer."""
    if math.isfinite(value) and value == int(value) and abs(value) < JSON_FLOAT_FROM:
        return int(value)
    return value


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None  # strconv.ParseFloat: out of range is an error


def _timestamp(text: str) -> str | None:
    """go-yaml's parseTimestamp, as Go's Time.String() prints the result (what Pulumi hands over)."""
    m = TIMESTAMP_RE.match(text)
    if not m:
        return None
    y, mo, d = int(m["y"]), int(m["mo"]), int(m["d"])
    if not (1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1]):
        return None
    h, mi, s = (int(m[k]) if m[k] else 0 for k in ("h", "mi", "s"))
    if h > 23 or mi > 59 or s > 59 or (m["sep"] == " " and m["z"]) or (m["sep"] in ("T", "t") and not m["z"]):
        return None
    frac = (m["f"] or "")[:9].rstrip("0")
    zone = m["z"] or "Z"
    if zone == "Z" or zone[1:] == "00:00":
        where = "+0000 UTC"  # UTC (and a zero offset where the engine runs in UTC)
    else:
        offset = zone.replace(":", "")
        where = f"{offset} {offset}"  # a fixed zone without a name: Go prints the offset twice
    return f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}{'.' + frac if frac else ''} {where}"


def resolve_plain(text: str) -> tuple[str, Any]:
    """(tag, value) of a plain scalar as go-yaml v3's resolve() reads it."""
    if text in RESOLVED:
        value = RESOLVED[text]
        tag = BOOL if isinstance(value, bool) else NULL if value is None else FLOAT
        return tag, value
    first = text[:1]
    if first == ".":
        if DOT_FLOAT.match(text) and _finite(text) is not None:
            return FLOAT, _finite(text)
    elif first.isascii() and (first.isdigit() or first in "+-"):
        stamp = _timestamp(text)
        if stamp is not None:
            return TIMESTAMP, stamp
        plain = text.replace("_", "")
        number = _go_int(plain)
        if number is not None:
            return INT, number
        if GO_FLOAT.match(plain) and _finite(plain) is not None:
            return FLOAT, _finite(plain)
    elif text == "<<":
        return MERGE, text
    return STR, text


def go_key_text(key: Any) -> str:
    """A key that is not text as Go's fmt %v prints it (Pulumi names map keys so)."""
    if key is None:
        return "<nil>"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return go_float_text(key)
    return str(key)


def go_float_text(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 64): the shortest digits, an exponent outside 1e-4..1e6."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)  # a finite number's (NaN and infinity are answered above)
    ds = "".join(map(str, digits))
    point = len(ds) + exponent  # digits before the decimal point
    x = point - 1
    lead = "-" if sign else ""
    if x < -4 or x >= 6:
        mantissa = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{lead}{mantissa}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if point <= 0:
        return f"{lead}0.{'0' * -point}{ds}"
    if point >= len(ds):
        return lead + ds + "0" * (point - len(ds))
    return f"{lead}{ds[:point]}.{ds[point:]}"


class KeyNotText(str):
    """A mapping key YAML reads as something else than text (a number, true, null, a date),
    named as Pulumi names it (`go_key_text`); `kind` says what it was, for a refusal."""

    kind: str = "text"

    def __new__(cls, text: str, kind: str = "text") -> KeyNotText:
        key = super().__new__(cls, text)
        key.kind = kind
        return key

    def __reduce__(self) -> tuple[type[KeyNotText], tuple[str, str]]:
        return KeyNotText, (str(self), self.kind)


KINDS = {BOOL: "true/false", NULL: "nothing (null)", INT: "a number", FLOAT: "a number", TIMESTAMP: "a date"}


class PulumiYamlError(yaml.YAMLError):
    """What go-yaml (and so Pulumi) refuses in a file PyYAML would read."""

    def __init__(self, problem: str, mark: Optional[yaml.Mark] = None):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


# libyaml's parser when PyYAML has it (its wheels do); the type checker reads the pure one's types.
if TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader
else:
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class PulumiLoader(_SafeLoader):
    """PyYAML's safe loader (libyaml's parser when PyYAML has it: its wheels do) resolving and
    constructing scalars as go-yaml v3 does."""

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return resolve_plain(value)[0]
        tag: str = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
        return tag

    def _scalar_as(self, node: yaml.Node, wanted: tuple[str, ...]) -> Any:
        """A scalar under one of go-yaml's tags (resolved, or written `!!int` and the like, quoted
        or not), read as go-yaml reads it; refused as go-yaml refuses `!!bool yes` ("cannot
        decode !!str `yes` as a !!bool")."""
        if not isinstance(node, yaml.ScalarNode):
            return self.construct_untagged("", node)  # go-yaml reads a tagged mapping as a mapping
        tag, value = resolve_plain(node.value)
        if tag not in wanted:
            short = f"!!{node.tag[len(Y):]}" if node.tag.startswith(Y) else node.tag
            raise PulumiYamlError(f"cannot decode !!{tag[len(Y):]} `{node.value[:60]}` as a {short}", node.start_mark)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise PulumiYamlError(f"`{node.value}` is not a number Pulumi can hand to the program "
                                      "(JSON has no NaN or infinity)", node.start_mark)
            return _as_program_sees(value)
        return value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """SafeConstructor's, with keys as Pulumi names them: a key that is not text becomes its
        Go text (`1`, `true`, `<nil>`, `1e+06`), so `1` and `true` stay two keys, as in Go."""
        self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag in KINDS:
                tag, value = resolve_plain(key_node.value)
                self._scalar_as(key_node, (FLOAT, INT) if key_node.tag == FLOAT else (key_node.tag,))  # refusals
                key = KeyNotText(go_key_text(value), KINDS[tag])
            else:
                key = self.construct_object(key_node, deep=deep)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                            "found unhashable key", key_node.start_mark) from None
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_go_bool(self, node: yaml.Node) -> Any:
        return self._scalar_as(node, (BOOL,))

    def construct_go_null(self, node: yaml.Node) -> Any:
        return self._scalar_as(node, (NULL,))

    def construct_go_int(self, node: yaml.Node) -> Any:
        return self._scalar_as(node, (INT,))

    def construct_go_float(self, node: yaml.Node) -> Any:
        return self._scalar_as(node, (FLOAT, INT))

    def construct_go_timestamp(self, node: yaml.Node) -> Any:
        return self._scalar_as(node, (TIMESTAMP,))

    def construct_go_binary(self, node: yaml.ScalarNode) -> str:
        try:
            data = base64.b64decode(self.construct_scalar(node).encode("ascii"), validate=False)
        except (binascii.Error, UnicodeEncodeError):
            raise PulumiYamlError("!!binary value contains invalid base64 data", node.start_mark) from None
        return data.decode("utf-8", errors="replace")  # Go's string of the bytes, as JSON writes it

    def construct_untagged(self, suffix: str, node: yaml.Node) -> Any:
        """A tag go-yaml does not resolve (`!foo`, `!!set`, `!!omap`): the value as written."""
        if isinstance(node, yaml.MappingNode):
            return self.construct_mapping(node)
        if isinstance(node, yaml.SequenceNode):
            return self.construct_sequence(node)
        assert isinstance(node, yaml.ScalarNode)  # YAML's third kind of node
        return self.construct_scalar(node)


for _tag, _method in ((BOOL, "construct_go_bool"), (NULL, "construct_go_null"), (INT, "construct_go_int"),
                      (FLOAT, "construct_go_float"), (TIMESTAMP, "construct_go_timestamp"),
                      (Y + "binary", "construct_go_binary")):
    PulumiLoader.add_constructor(_tag, getattr(PulumiLoader, _method))


def _untagged(loader: PulumiLoader, node: yaml.Node) -> Any:
    return loader.construct_untagged("", node)


for _tag in (Y + "set", Y + "omap", Y + "pairs"):
    PulumiLoader.add_constructor(_tag, _untagged)
PulumiLoader.add_constructor(None, _untagged)


class PulumiDumper(yaml.SafeDumper):
    """PyYAML's safe dumper that quotes a text go-yaml would read as something else (`1e3`,
    `0o17`, `08`) and leaves plain what it reads as text (`on`, `yes`): what it writes, Pulumi
    reads back as given (tests write stack files with it)."""

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return resolve_plain(value)[0]
        tag: str = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
        return tag


def _represent_key(dumper: PulumiDumper, key: KeyNotText) -> yaml.ScalarNode:
    # Written back as the number, true or null it was read from (a date stays its text).
    text = "~" if key.kind == KINDS[NULL] else str(key)
    return dumper.represent_scalar(resolve_plain(text)[0], text)


PulumiDumper.add_representer(KeyNotText, _represent_key)


def dump(doc: Any) -> str:
    """`doc` as YAML that Pulumi (and `read_yaml`) read back as `doc`."""
    text: str = yaml.dump(doc, Dumper=PulumiDumper, sort_keys=False, allow_unicode=True)
    return text
