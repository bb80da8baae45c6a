"""What the ModelWeights provider runs on a host, as constant scripts whose values are arguments
(the pattern of reads.py: the static audit of tests/test_bad_input_corpus.py holds for them).

Both are Python 3 with the standard library only (a bare host has python3 before any venv;
the rehearsal host's is Debian 12's 3.11), run as ``python3 -c SCRIPT ARGS...``:

- READ_SCRIPT, the cheap read (every refresh, the switch's preflight): each file's size, mtime and
  inode, the index's shard list, each shard's size as its safetensors header declares it (8 bytes
  of length, then the JSON header: a few kB to a few MB, never the data), and the free space.
  `weights.parse_read` parses it, `weights.check_copy` judges it.
- VERIFY_SCRIPT, the full SHA-256 pass: the files hashed in parallel over the host's cores (one
  process a file, as many processes as cores unless told), progress on stderr every few seconds
  (files, GB, GB/s, time left), one JSON line a file on stdout, exit 1 when a file could not be
  read. `weights.verify_problems` compares the sums with the manifest; at the source the same
  lines are the manifest (`weights.manifest_from_listing`).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from .reads import command

# $1: the checkpoint directory. One line of JSON: {"directory", "exists", "free_bytes", "files":
# {path: [size, mtime_ns, inode]}, "index_shards": [...] | null, "index_error", "headers":
# {shard: declared size | "error text"}}. Headers are read as safetensors reads them: the 8-byte
# little-endian length first, at most 100,000,000 bytes of header (its MAX_HEADER_SIZE).
READ_SCRIPT = r'''
import json, os, struct, sys
class Bad(Exception):
    pass
d = sys.argv[1]
out = {"directory": d, "exists": os.path.isdir(d), "files": {}, "index_shards": None, "index_error": None,
       "headers": {}, "free_bytes": None}
probe = d
while not os.path.isdir(probe) and probe not in ("", "/"):
    probe = os.path.dirname(probe)
try:
    st = os.statvfs(probe or "/")
    out["free_bytes"] = st.f_bavail * st.f_frsize
except OSError:
    pass
if out["exists"]:
    for root, dirs, names in os.walk(d):
        dirs.sort()
        for n in sorted(names):
            p = os.path.join(root, n)
            try:
                s = os.stat(p)
            except OSError:
                continue
            out["files"][os.path.relpath(p, d)] = [s.st_size, s.st_mtime_ns, s.st_ino]
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                out["index_shards"] = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            out["index_error"] = "%s: %s" % (type(e).__name__, e)
    shards = out["index_shards"] or [p for p in out["files"] if p.endswith(".safetensors")]
    for shard in shards:
        p = os.path.join(d, shard)
        try:
            with open(p, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise Bad("header too small")
                n = struct.unpack("<Q", head)[0]
                if n > 100000000:
                    raise Bad("header too large")
                raw = f.read(n)
            if len(raw) < n:
                raise Bad("invalid header length")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise Bad("invalid UTF-8 in header: %s" % e)
            try:
                header = json.loads(text)
                end = max([int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"] or [0])
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
                raise Bad("invalid JSON in header: %s" % e)
            out["headers"][shard] = 8 + n + end
        except FileNotFoundError:
            continue
        except Bad as e:
            out["headers"][shard] = str(e)
        except OSError as e:
            out["headers"][shard] = "I/O error: %s" % (e.strerror or e)
print(json.dumps(out, sort_keys=True))
'''

# $1: the directory, $2: processes (0: one a core), $3: seconds between progress lines, $4...:
# the files (relative paths). stdout: one JSON line a file ({"path", "size", "sha256"} or
# {"path", "error"}), then {"done": true, ...}. stderr: "verify: F/N files, X/Y GB, R GB/s,
# T left" lines. The bytes hashed are counted per 8 MiB read in a shared counter, so progress
# moves inside a 9 GB shard, not only when one ends.
VERIFY_SCRIPT = r'''
import hashlib, json, multiprocessing as mp, os, sys, time
d, procs, every, paths = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
CHUNK = 8 << 20
ctx = mp.get_context("fork")  # the workers are this script's own functions (no module to import)
counter = ctx.Value("q", 0)
def size_of(p):
    try:
        return os.path.getsize(os.path.join(d, p))
    except OSError:
        return 0
def one(p):
    h = hashlib.sha256()
    n = 0
    try:
        with open(os.path.join(d, p), "rb", buffering=0) as f:
            while True:
                b = f.read(CHUNK)
                if not b:
                    break
                h.update(b)
                n += len(b)
                with counter.get_lock():
                    counter.value += len(b)
    except OSError as e:
        return {"path": p, "error": "%s: %s" % (type(e).__name__, e.strerror or e)}
    return {"path": p, "size": n, "sha256": h.hexdigest()}
def line(done, total_files, total, start):
    seen = counter.value
    took = max(time.monotonic() - start, 1e-6)
    rate = seen / took
    left = (total - seen) / rate if rate > 0 else 0.0
    return "verify: %d/%d files, %.2f/%.2f GB, %.2f GB/s, %ds left" % (
        done, total_files, seen / 1e9, total / 1e9, rate / 1e9, int(left + 0.5))
if __name__ == "__main__":
    total = sum(size_of(p) for p in paths)
    workers = procs or os.cpu_count() or 1
    start = time.monotonic()
    bad = 0
    done = 0
    last = start
    # Largest first: the longest file never starts last and keeps one core busy alone at the end.
    order = sorted(paths, key=size_of, reverse=True)
    with ctx.Pool(max(1, min(workers, len(paths) or 1))) as pool:
        pending = pool.imap_unordered(one, order)
        while done < len(paths):
            try:
                r = pending.next(timeout=min(max(every, 0.05), 1.0))  # never a busy loop
            except mp.TimeoutError:
                r = None
            if r is not None:
                done += 1
                bad += "error" in r
                sys.stdout.write(json.dumps(r, sort_keys=True) + "\n")
                sys.stdout.flush()
            now = time.monotonic()
            if now - last >= every or done == len(paths):
                sys.stderr.write(line(done, len(paths), total, start) + "\n")
                sys.stderr.flush()
                last = now
    took = time.monotonic() - start
    sys.stdout.write(json.dumps({"done": True, "files": len(paths), "bytes": counter.value, "seconds": round(took, 3),
                                 "processes": workers}, sort_keys=True) + "\n")
    sys.exit(1 if bad else 0)
'''

PROGRESS = re.compile(r"\Averify: (\d+)/(\d+) files, ([0-9.]+)/([0-9.]+) GB, ([0-9.]+) GB/s, (\d+)s left\Z", re.ASCII)


def read_checkpoint(directory: str) -> dict[str, Any]:
    """The cheap read of one directory (READ_SCRIPT)."""
    return command(["python3", "-c", READ_SCRIPT, directory], purpose=f"reading the checkpoint in {directory}",
                   timeout=120, check=True)


def verify_checkpoint(directory: str, paths: list[str], *, processes: int = 0, every: float = 5.0,
                      timeout: float = 7200) -> dict[str, Any]:
    """The full SHA-256 pass over `paths` of `directory` (VERIFY_SCRIPT); `processes` 0: one a core.
    Not checked: exit 1 names unreadable files in the answer."""
    return command(["python3", "-c", VERIFY_SCRIPT, directory, str(int(processes)), f"{every:g}", *paths],
                   purpose=f"verifying {len(paths)} files in {directory}", timeout=timeout, check=False)


def parse_progress(line: str) -> Optional[dict[str, Any]]:
    """One of VERIFY_SCRIPT's progress lines as numbers (None for any other line)."""
    m = PROGRESS.fullmatch(line.strip())
    if not m:
        return None
    done, files, seen, total, rate, left = m.groups()
    return {"files": int(done), "of": int(files), "gb": float(seen), "total_gb": float(total), "gb_s": float(rate),
            "seconds_left": int(left)}
