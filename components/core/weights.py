"""A checkpoint as data: its manifest, what a host's copy lacks, what to repair, whether it fits.

Pure: state in, verdicts out (cases under tests/data/weights/). The host-side reads that feed it
are components/core/weights_host.py; the staging plan over several hosts is weights_staging.py.

- A **manifest** is every file's path, size and SHA-256, from a directory listing computed once
  at the source (`manifest_from_listing`, VERIFY_SCRIPT's answer) or from the Hub's file
  metadata (`manifest_from_hub`: sizes, and the SHA-256 of LFS files; a small file kept in git
  has only its git blob id there, so its SHA-256 is filled in by the first full verify).
- The **cheap check** (every refresh, the preflight of a switch) looks at what READ_SCRIPT
  reports: each file present with its size; without a manifest, config.json, the index and every
  shard it names, each as large as its own safetensors header declares. A file whose mtime or
  inode moved since it was verified is named too: its content may have changed.
- The **full verify** compares SHA-256 sums (`verify_problems`); **repair** fetches only the
  files found missing, resized or corrupt; **space** compares what those need with what is free.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

# Sizes are shown in decimal gigabytes, as disks are sold and `df -H` prints them.
GB = 1_000_000_000
CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# What a host-side tool leaves in the directory and no checkpoint holds: huggingface_hub's
# local_dir metadata (.cache/huggingface/), the staging's partial files (.cache/gpu-serving/
# partial/<path>: a file is written there and renamed into place when whole, so a server that
# has the old one mapped keeps it, and a cut transfer resumes from it).
TOOL_DIR = ".cache"
PARTIAL_DIR = ".cache/gpu-serving/partial/"
SHA256 = re.compile(r"\A[0-9a-f]{64}\Z", re.ASCII)
# A path inside a checkpoint: relative, '/'-separated, no '.' or '..' segment, no character a
# command line or a message would read specially. Hub repositories use these characters.
_PATH = re.compile(r"\A[A-Za-z0-9_+=@,-][A-Za-z0-9_.+=@,-]*(?:/[A-Za-z0-9_+=@,-][A-Za-z0-9_.+=@,-]*)*\Z", re.ASCII)
MAX_PATH = 1024

# The kinds of problem a copy can have, and what each means for `up`.
MISSING = "missing"          # not there: copied
RESIZED = "resized"          # not the size the manifest (or its own header) says: copied again
CORRUPT = "corrupt"          # the size is right, the SHA-256 is not (full verify): copied again
CHANGED = "changed"          # mtime or inode moved since it was verified: verify again (--full)
UNREADABLE = "unreadable"    # a shard whose safetensors header cannot be read: copied again
NO_DIRECTORY = "no-directory"
FETCHED = (MISSING, RESIZED, CORRUPT, UNREADABLE)


def gb(n: int) -> str:
    return f"{n / GB:,.1f} GB" if n >= GB / 10 or n == 0 else f"{n / GB:,.3f} GB"


def checked_path(path: str) -> str:
    """A manifest path, or ValueError: these become command arguments and file names on hosts."""
    if not isinstance(path, str) or len(path) > MAX_PATH or not _PATH.fullmatch(path):
        raise ValueError(f"{path!r:.80} is not a safe relative path inside a checkpoint")
    if any(seg in (".", "..") for seg in path.split("/")):
        raise ValueError(f"{path!r:.80} leaves the checkpoint directory")
    return path


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    # None: not known yet (a small file the Hub keeps in git; filled in by the first full verify).
    sha256: Optional[str] = None

    def __post_init__(self) -> None:
        checked_path(self.path)
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 0:
            raise ValueError(f"{self.path}: size {self.size!r} is not a byte count")
        if self.sha256 is not None and not SHA256.fullmatch(self.sha256):
            raise ValueError(f"{self.path}: {self.sha256!r:.80} is not a SHA-256 (64 lower-case hex digits)")


@dataclass(frozen=True)
class Manifest:
    """What the checkpoint is: `files` sorted by path; `source` says where it was taken from."""

    source: str
    files: tuple[FileEntry, ...]

    def __post_init__(self) -> None:
        paths = [f.path for f in self.files]
        if paths != sorted(set(paths)):
            raise ValueError("manifest paths must be unique and sorted")

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def by_path(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    def summary(self) -> str:
        """The preview's line: "N files, X GB, from <source>"."""
        n = len(self.files)
        return f"{n} file{'s' if n != 1 else ''}, {gb(self.total_bytes)}, from {self.source}"

    def to_props(self) -> dict[str, Any]:
        """Plain data for the stack's state (a dynamic resource's outputs)."""
        return {"source": self.source, "files": [[f.path, f.size, f.sha256] for f in self.files]}

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> "Manifest":
        return cls(str(props["source"]), tuple(FileEntry(str(p), int(s), h) for p, s, h in props["files"]))

    def with_hashes(self, computed: dict[str, str]) -> "Manifest":
        """The manifest with the SHA-256 sums it lacked taken from a full verify (`computed`:
        path -> sum); a sum it has is never replaced (that is a corrupt file, not news)."""
        return Manifest(self.source, tuple(FileEntry(f.path, f.size, f.sha256 or computed.get(f.path))
                                           for f in self.files))


def _is_checkpoint_file(path: str) -> bool:
    return not (path == TOOL_DIR or path.startswith(TOOL_DIR + "/"))


def manifest_from_listing(source: str, entries: Iterable[dict[str, Any]]) -> Manifest:
    """From what VERIFY_SCRIPT printed at the source: one {"path", "size", "sha256"} a file
    (its other lines, progress and the summary, are not files). Tool files are left out."""
    files = []
    for e in entries:
        if "path" not in e or "sha256" not in e:
            if "error" in e and "path" in e:
                raise ValueError(f"{e['path']}: could not be read at the source ({e['error']})")
            continue
        if _is_checkpoint_file(e["path"]):
            files.append(FileEntry(e["path"], int(e["size"]), e["sha256"]))
    return Manifest(source, tuple(sorted(files, key=lambda f: f.path)))


def manifest_from_hub(source: str, entries: Iterable[dict[str, Any]]) -> Manifest:
    """From the Hub's file metadata: the tree listing (GET /api/models/<repo>/tree/<commit>?
    recursive=true: {"type", "path", "size", "oid", "lfs": {"oid", "size"}}) or model_info's
    siblings (?blobs=true: {"rfilename", "size", "blobId", "lfs": {"sha256", "size"}}). An LFS
    file's SHA-256 is its LFS oid; a file kept in git has none here."""
    files = []
    for e in entries:
        if e.get("type", "file") != "file":
            continue
        path: Any = e.get("path", e.get("rfilename"))  # checked by FileEntry
        lfs = e.get("lfs") or None
        if lfs:
            sha, size = lfs.get("oid", lfs.get("sha256")), lfs.get("size", e.get("size"))
        else:
            sha, size = None, e.get("size")
        if size is None:
            raise ValueError(f"{path}: the Hub reported no size (ask with files_metadata=True / ?blobs=true)")
        files.append(FileEntry(path, int(size), sha))
    return Manifest(source, tuple(sorted(files, key=lambda f: f.path)))


# --- what a host's copy lacks -----------------------------------------------------------------

@dataclass(frozen=True)
class Seen:
    """A file as a cheap read sees it."""

    size: int
    mtime_ns: int = 0
    ino: int = 0


@dataclass(frozen=True)
class HostRead:
    """READ_SCRIPT's answer for one directory (`parse_read`)."""

    directory: str
    exists: bool
    files: dict[str, Any] = field(default_factory=dict)        # path -> Seen (tool files left out)
    partials: dict[str, Any] = field(default_factory=dict)     # path -> bytes already in its partial file
    index_shards: Optional[tuple[Any, ...]] = None             # the shards the index names; None: no index
    index_error: Optional[str] = None
    headers: dict[str, Any] = field(default_factory=dict)      # shard -> size its header declares, or an error text
    free_bytes: Optional[int] = None                 # free space where the directory is (or would be)


def parse_read(stdout: str) -> HostRead:
    """READ_SCRIPT's one line of JSON."""
    d = json.loads(stdout.strip().splitlines()[-1])
    files, partials = {}, {}
    for path, (size, mtime_ns, ino) in d.get("files", {}).items():
        if path.startswith(PARTIAL_DIR):
            partials[path[len(PARTIAL_DIR):]] = int(size)
        elif _is_checkpoint_file(path):
            files[path] = Seen(int(size), int(mtime_ns), int(ino))
    shards = d.get("index_shards")
    return HostRead(directory=d["directory"], exists=bool(d["exists"]), files=files, partials=partials,
                    index_shards=tuple(shards) if shards is not None else None, index_error=d.get("index_error"),
                    headers=dict(d.get("headers", {})), free_bytes=d.get("free_bytes"))


@dataclass(frozen=True)
class Problem:
    path: str
    kind: str
    expected: Optional[int] = None
    actual: Optional[int] = None
    detail: str = ""

    def words(self) -> str:
        """How drift and refusals name it: the file and what is wrong with it."""
        if self.kind == NO_DIRECTORY:
            return f"{self.path} does not exist"
        if self.kind == MISSING:
            return f"{self.path} is missing" + (f" ({self.detail})" if self.detail else "")
        if self.kind == RESIZED:
            return f"{self.path} is {self.actual:,} bytes, not {self.expected:,}" + (f" ({self.detail})" if self.detail else "")
        if self.kind == CORRUPT:
            return f"{self.path} is corrupt: its SHA-256 is not the manifest's" + (f" ({self.detail})" if self.detail else "")
        if self.kind == CHANGED:
            return f"{self.path} changed since it was verified ({self.detail}): verify again with --full"
        return f"{self.path} is unreadable: {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "expected": self.expected, "actual": self.actual,
                "detail": self.detail}


def check_copy(read: HostRead, manifest: Optional[Manifest] = None,
               verified: Optional[dict[str, Any]] = None) -> list[Problem]:
    """What the host's copy lacks, from a cheap read (no byte of a shard hashed).

    With a `manifest`: every file of it, present with its size; `verified` (path -> Seen as
    recorded when the copy was last verified) names the files whose mtime or inode moved since.
    Without one (model.source verify on a directory gpu-serving never staged): what SGLang's loader
    needs, config.json, then the index and every shard it names (or, without an index, at least
    one *.safetensors), each as large as its safetensors header declares."""
    if not read.exists:
        return [Problem(read.directory, NO_DIRECTORY)]
    problems: list[Problem] = []
    if manifest is not None:
        for f in manifest.files:
            seen = read.files.get(f.path)
            if seen is None:
                problems.append(Problem(f.path, MISSING, expected=f.size))
            elif seen.size != f.size:
                problems.append(Problem(f.path, RESIZED, expected=f.size, actual=seen.size))
            elif verified and f.path in verified and (verified[f.path].mtime_ns, verified[f.path].ino) != (
                    seen.mtime_ns, seen.ino):
                was = verified[f.path]
                what = "inode" if was.ino != seen.ino else "mtime"
                problems.append(Problem(f.path, CHANGED, expected=f.size, actual=seen.size, detail=f"its {what} moved"))
        names = set(manifest.by_path)
    else:
        names = set()
    # What the loader itself reads, checked against the files' own declarations too.
    if CONFIG not in read.files and CONFIG not in names:
        problems.append(Problem(CONFIG, MISSING, detail="SGLang reads the model's architecture from it"))
    if read.index_error:
        problems.append(Problem(INDEX, UNREADABLE, detail=read.index_error))
    shards = read.index_shards
    if shards is None and not read.index_error:
        loose = sorted(p for p in read.files if p.endswith(".safetensors") and "/" not in p)
        if INDEX in names or (not loose and manifest is None):
            problems.append(Problem(INDEX, MISSING, detail="it names the shards"))
        shards = tuple(loose)
    for shard in shards or ():
        seen = read.files.get(shard)
        if seen is None:
            problems.append(Problem(shard, MISSING, detail=f"named in {INDEX}"))
            continue
        declared = read.headers.get(shard)
        if isinstance(declared, str):
            problems.append(Problem(shard, UNREADABLE, actual=seen.size, detail=declared))
        elif isinstance(declared, int) and declared != seen.size:
            problems.append(Problem(shard, RESIZED, expected=declared, actual=seen.size,
                                    detail="its safetensors header declares the larger size" if declared > seen.size
                                    else "longer than its safetensors header declares"))
    first: dict[str, Problem] = {}
    for p in problems:
        first.setdefault(p.path, p)  # the manifest's verdict on a file before the loader's
    return sorted(first.values(), key=lambda p: p.path)


def verify_problems(manifest: Manifest, answers: Iterable[dict[str, Any]]) -> list[Problem]:
    """The full verify's verdict: VERIFY_SCRIPT's answers ({"path", "size", "sha256"} or
    {"path", "error"}) against the manifest. A file without a known SHA-256 passes on its size."""
    got = {a["path"]: a for a in answers if "path" in a}
    problems = []
    for f in manifest.files:
        a = got.get(f.path)
        if a is None or "error" in a:
            detail = a["error"] if a else "not hashed"
            problems.append(Problem(f.path, MISSING if a is None or "No such file" in detail else UNREADABLE,
                                    expected=f.size, detail=detail if a else ""))
        elif int(a["size"]) != f.size:
            problems.append(Problem(f.path, RESIZED, expected=f.size, actual=int(a["size"])))
        elif f.sha256 is not None and a["sha256"] != f.sha256:
            problems.append(Problem(f.path, CORRUPT, expected=f.size, actual=int(a["size"]),
                                    detail=f"{a['sha256'][:12]}... where {f.sha256[:12]}... was recorded"))
    return problems


@dataclass(frozen=True)
class Repair:
    """The files `up` fetches for one host (only those found wrong), or none and why."""

    files: tuple[FileEntry, ...]
    reason: str

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {"files": [f.path for f in self.files], "bytes": self.bytes, "reason": self.reason}


def repair(manifest: Manifest, problems: list[Problem]) -> Repair:
    """Only what is missing or wrong is fetched again, never the whole checkpoint. A file that only
    `changed` (mtime/inode) is not refetched on that ground: `weights verify --full` decides."""
    wrong = {p.path for p in problems if p.kind in FETCHED}
    if any(p.kind == NO_DIRECTORY for p in problems):
        wrong = set(manifest.by_path)
    files = tuple(f for f in manifest.files if f.path in wrong)
    unknown = sorted(wrong - set(manifest.by_path))
    if unknown:
        raise ValueError(f"not in the manifest, so not fetched: {', '.join(unknown)}")
    if not files:
        changed = [p.path for p in problems if p.kind == CHANGED]
        return Repair((), f"all {len(manifest.files)} files present with their sizes: nothing to copy" + (
            f" ({len(changed)} changed since verified: run weights verify --full)" if changed else ""))
    return Repair(files, f"{len(files)} of {len(manifest.files)} files to copy ({gb(sum(f.size for f in files))}): "
                         + ", ".join(f.path for f in files[:5]) + (", ..." if len(files) > 5 else ""))


def space_needed(fetch: Repair, read: HostRead) -> int:
    """Bytes the host must still find for `fetch`: each file's size, less what its partial file
    already holds (a resumed transfer continues it). A wrong copy in place is freed only when the
    new one is renamed over it, so it does not count as room."""
    return sum(max(f.size - read.partials.get(f.path, 0), 0) for f in fetch.files)


def space_refusal(host: str, fetch: Repair, read: HostRead) -> Optional[str]:
    """None when the copy fits; else the refusal, in GB, naming the host and the directory."""
    need = space_needed(fetch, read)
    if need == 0 or read.free_bytes is None or need <= read.free_bytes:
        return None
    return (f"{host}: needs {gb(need)} for {len(fetch.files)} file{'s' if len(fetch.files) != 1 else ''} in "
            f"{read.directory}, {gb(read.free_bytes)} free: free {gb(need - read.free_bytes)} there, or set "
            "gpu-serving:model.path to a larger disk")


def drift_lines(host: str, problems: list[Problem]) -> list[str]:
    """The drift check's words on `<host>-model-weights`, one a file (at most 10, then a count)."""
    name = f"{host}-model-weights" if host else "model-weights"
    lines = [f"{name}: {p.words()}" for p in problems[:10]]
    if len(problems) > 10:
        lines.append(f"{name}: ... and {len(problems) - 10} more")
    return lines
