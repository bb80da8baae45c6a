"""Build the rehearsal engine (rehearsal/engine/, distribution ``sglang-rehearsal``) into a wheel.

    from rehearsal.engine_wheel import build
    wheel = build(dest_dir)          # -> Path to sglang_rehearsal-<version>-py3-none-any.whl

Offline and stdlib-only: the wheel is written directly (zip + dist-info, PEP 427), so neither pip
nor setuptools is needed where the Pulumi program runs. Entries carry a fixed timestamp, so the
same sources always give the same bytes (a content hash is a fair change detector).
``pip wheel --no-deps --no-build-isolation rehearsal/engine -w DIR`` builds an equivalent wheel
with setuptools, for people who prefer it. Command line: ``python -m rehearsal.engine_wheel DIR``.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import sys
import zipfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "engine"
PACKAGES = ("sglang", "sglang/_rehearsal")
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


def project_metadata(source: Path = SOURCE) -> dict:
    """name, version, description, requires-python from rehearsal/engine/pyproject.toml."""
    text = (source / "pyproject.toml").read_text(encoding="utf-8")
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    fields = dict(re.findall(r'^([a-z-]+)\s*=\s*"([^"]*)"', project, flags=re.M))
    return {"name": fields["name"], "version": fields["version"],
            "summary": fields.get("description", ""), "requires_python": fields.get("requires-python", "")}


def wheel_name(meta: dict) -> str:
    return "%s-%s-py3-none-any.whl" % (re.sub(r"[-_.]+", "_", meta["name"]), meta["version"])


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def build(dest_dir, source: Path = SOURCE, by_content: bool = False) -> Path:
    """Write the engine wheel into dest_dir (created if needed) and return its path. by_content:
    into dest_dir/<its digest>/ instead: checkouts with other engine sources build the same file
    name (one version), and a shared cache must not let one replace another's between a
    program's build and its provider's upload."""
    source = Path(source)
    meta = project_metadata(source)
    dest = Path(dest_dir)
    dist_info = "%s-%s.dist-info" % (re.sub(r"[-_.]+", "_", meta["name"]), meta["version"])
    files: list[tuple[str, bytes]] = []
    for package in PACKAGES:
        # *.json: the performance model's parameters ship beside its code.
        for path in sorted([*(source / package).glob("*.py"), *(source / package).glob("*.json")]):
            files.append(("%s/%s" % (package, path.name), path.read_bytes()))
    readme = source / "README.md"
    metadata = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nRequires-Python: %s\n"
                % (meta["name"], meta["version"], meta["summary"], meta["requires_python"]))
    if readme.exists():
        metadata += "Description-Content-Type: text/markdown\n\n" + readme.read_text(encoding="utf-8")
    files += [
        (dist_info + "/METADATA", metadata.encode()),
        (dist_info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: gpu-serving rehearsal.engine_wheel\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        (dist_info + "/top_level.txt", b"sglang\n"),
    ]
    record = "".join(_record_line(name, data) + "\n" for name, data in files) + dist_info + "/RECORD,,\n"
    files.append((dist_info + "/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as whl:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            whl.writestr(info, data)
    wheel = buf.getvalue()
    if by_content:
        dest = dest / hashlib.sha256(wheel).hexdigest()[:16]
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / wheel_name(meta)
    try:
        if target.read_bytes() == wheel:
            return target  # reproducible: the same sources make the same bytes
    except OSError:
        pass
    # A name of its own: several programs (stacks deployed in parallel) may build at once.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(wheel)
    tmp.replace(target)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m rehearsal.engine_wheel DEST_DIR")
    print(build(sys.argv[1]))
