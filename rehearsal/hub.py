"""A Hub-compatible endpoint for tests and benchmarks: serves stand-in checkpoints to the real
``huggingface_hub`` client (``snapshot_download(..., endpoint=...)`` or HF_ENDPOINT).

What the pinned client (huggingface_hub 2.4.0) asks, read from its source, and what this answers:

- ``GET /api/models/<org>/<name>/tree/<revision>[/<path>]?recursive=...`` (snapshot_download,
  list_repo_tree): ``[{"type": "file", "path", "size", "oid" (git blob id), "lfs": {"oid"
  (SHA-256), "size", "pointerSize"}}]``, directories as ``{"type": "directory", "path", "oid"}``
  when not recursive. No ``xetHash``: the client then downloads over plain HTTP.
- ``GET /api/models/<org>/<name>/revision/<revision>[?blobs=true]`` (model_info / repo_info):
  ``{"id", "sha", "siblings": [{"rfilename", "size", "blobId", "lfs": {"sha256", "size",
  "pointerSize"}}]}`` (sizes and blob ids only with blobs=true, as the Hub does).
- ``HEAD|GET /<org>/<name>/resolve/<revision>/<path>`` (hf_hub_download): a file kept in git is
  answered here (``ETag`` its git blob id, ``X-Repo-Commit``, ``Content-Length``); an LFS file
  (``*.safetensors``, or over 10 MB) is a 302 to the "CDN" origin (a second port: another origin,
  so the client keeps the metadata of the 302, ``X-Linked-Etag`` = its SHA-256, ``X-Linked-Size``,
  ``X-Repo-Commit``, and drops its Authorization header), whose URL is signed and expires.
- The CDN answers ``Range: bytes=N-`` with 206 (the client resumes a cut stream that way).
- A token, when the server has one, is checked on every Hub call (``Authorization: Bearer``);
  a wrong or missing one gets the Hub's 401 with ``X-Error-Code: RepoNotFound``. A revision that
  is neither the commit nor ``main`` is 404 ``RevisionNotFound``; a missing file 404
  ``EntryNotFound``.

Every CDN byte served is counted per file (`served`), so a test can tell what a download moved.
``python -m rehearsal.hub DIR --repo ORG/NAME [--bind 127.0.0.1] [--port 0]`` serves DIR; the
token comes from $REHEARSAL_HUB_TOKEN, never the command line.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, quote, unquote, urlsplit

# What the Hub stores with LFS: safetensors always (the repositories' .gitattributes), anything
# over 10 MB (the Hub refuses larger files in git).
LFS_LIMIT = 10 * 1000 * 1000
# How long a signed CDN URL stays valid.
SIGNED_SECONDS = 3600
PIECE = 1 << 20


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    blob_id: str              # git's blob sha1, what the Hub calls oid
    sha256: Optional[str]     # LFS files only

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None


def _git_blob_id(data_path: Path, size: int) -> str:
    h = hashlib.sha1(b"blob %d\0" % size)
    with open(data_path, "rb") as f:
        for piece in iter(lambda: f.read(PIECE), b""):
            h.update(piece)
    return h.hexdigest()


def _sha256(data_path: Path) -> str:
    h = hashlib.sha256()
    with open(data_path, "rb") as f:
        for piece in iter(lambda: f.read(PIECE), b""):
            h.update(piece)
    return h.hexdigest()


def _lfs_pointer_size(sha256: str, size: int) -> int:
    return len(f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n")


@dataclass
class HubRepo:
    repo_id: str
    commit: str
    directory: Path
    files: dict  # path -> HubFile


class StandinHub:
    """The endpoint: `add` repositories, `start`, hand `endpoint` to the client, `stop`."""

    def __init__(self, token: Optional[str] = None, bind: str = "127.0.0.1", port: int = 0, cdn_port: int = 0):
        self.token = token
        self.repos: dict[str, HubRepo] = {}
        self.served: Counter = Counter()          # (repo_id, path) -> bytes the CDN sent
        self.calls: list[tuple[str, str, int]] = []  # (method, path without query, status)
        self.key = secrets.token_bytes(32)
        self.lock = threading.Lock()
        self.api = ThreadingHTTPServer((bind, port), _handler(self, cdn=False))
        self.cdn = ThreadingHTTPServer((bind, cdn_port), _handler(self, cdn=True))
        self.api.daemon_threads = self.cdn.daemon_threads = True
        self.threads: list[threading.Thread] = []

    @property
    def endpoint(self) -> str:
        host, port = self.api.server_address[:2]
        return f"http://{host}:{port}"

    def cdn_base(self) -> str:
        host, port = self.cdn.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo_id: str, directory: Path, commit: Optional[str] = None) -> str:
        """Serve `directory` as `repo_id` at one commit (default: a hash of its manifest, so the
        same files give the same commit). Returns the commit."""
        files = {}
        for p in sorted(Path(directory).rglob("*")):
            if p.is_file() and ".cache" not in p.relative_to(directory).parts:
                rel = p.relative_to(directory).as_posix()
                size = p.stat().st_size
                lfs = rel.endswith(".safetensors") or size > LFS_LIMIT
                files[rel] = HubFile(rel, size, _git_blob_id(p, size), _sha256(p) if lfs else None)
        if commit is None:
            listing = json.dumps([[f.path, f.size, f.blob_id] for f in files.values()]).encode()
            commit = hashlib.sha1(b"gpu-serving-standin-hub\0" + listing).hexdigest()
        self.repos[repo_id] = HubRepo(repo_id, commit, Path(directory), files)
        return commit

    def start(self) -> "StandinHub":
        for server in (self.api, self.cdn):
            t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stop(self) -> None:
        for server in (self.api, self.cdn):
            server.shutdown()
            server.server_close()
        for t in self.threads:
            t.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- signed CDN URLs
    def sign(self, repo_id: str, path: str) -> str:
        expires = int(time.time()) + SIGNED_SECONDS
        msg = f"{repo_id}\0{path}\0{expires}".encode()
        sig = hmac.new(self.key, msg, hashlib.sha256).hexdigest()
        return f"{self.cdn_base()}/repos/{quote(repo_id)}/{quote(path)}?expires={expires}&signature={sig}"

    def signed_ok(self, repo_id: str, path: str, query: dict) -> bool:
        try:
            expires = int(query["expires"][0])
            sig = query["signature"][0]
        except (KeyError, ValueError, IndexError):
            return False
        msg = f"{repo_id}\0{path}\0{expires}".encode()
        return expires >= time.time() and hmac.compare_digest(hmac.new(self.key, msg, hashlib.sha256).hexdigest(), sig)


def _handler(hub: StandinHub, cdn: bool):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "gpu-serving-standin-hub"

        def log_message(self, fmt, *args):  # the calls are kept in hub.calls, not printed
            pass

        def do_HEAD(self):
            self.route(head=True)

        def do_GET(self):
            self.route(head=False)

        # --- answers
        def answer(self, status: int, headers: Optional[dict] = None, body: bytes = b"", head: bool = False,
                   length: Optional[int] = None):
            # Recorded before the answer leaves: a client that has read it may look at once.
            with hub.lock:
                hub.calls.append((self.command, urlsplit(self.path).path, status))
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if body and not head:
                self.wfile.write(body)

        def error(self, status: int, code: str, message: str, head: bool):
            body = json.dumps({"error": message}).encode()
            self.answer(status, {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"},
                        body, head)

        def json(self, obj, head: bool, extra: Optional[dict] = None):
            self.answer(200, {"Content-Type": "application/json", **(extra or {})}, json.dumps(obj).encode(), head)

        # --- routing
        def route(self, head: bool):
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.split("/") if p]
            query = parse_qs(url.query)
            try:
                if cdn:
                    return self.cdn_get(parts, query, head)
                if not self.authorized():
                    return self.error(401, "RepoNotFound", "Invalid credentials in Authorization header", head)
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("tree", "revision"):
                    return self.api(f"{parts[2]}/{parts[3]}", parts[4], parts[5], "/".join(parts[6:]), query, head)
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self.resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
                return self.error(404, "EntryNotFound", "not a route of this endpoint", head)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def authorized(self) -> bool:
            if hub.token is None:
                return True
            given = self.headers.get("Authorization", "")
            return hmac.compare_digest(given.encode(), f"Bearer {hub.token}".encode())

        def repo_at(self, repo_id: str, revision: str, head: bool) -> Optional[HubRepo]:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self.error(404, "RepoNotFound", "Repository not found", head)
                return None
            if revision not in (repo.commit, "main"):
                self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                return None
            return repo

        def api(self, repo_id: str, what: str, revision: str, sub: str, query: dict, head: bool):
            repo = self.repo_at(repo_id, revision, head)
            if repo is None:
                return
            if what == "revision":
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                siblings = []
                for f in repo.files.values():
                    s = {"rfilename": f.path}
                    if blobs:
                        s.update({"size": f.size, "blobId": f.blob_id})
                        if f.lfs:
                            s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": _lfs_pointer_size(f.sha256, f.size)}
                    siblings.append(s)
                return self.json({"_id": repo.commit[:24], "id": repo_id, "modelId": repo_id, "sha": repo.commit,
                                  "private": hub.token is not None, "disabled": False, "gated": False,
                                  "tags": [], "siblings": siblings}, head)
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            prefix = f"{sub}/" if sub else ""
            entries, dirs = [], set()
            for f in repo.files.values():
                if not f.path.startswith(prefix):
                    continue
                rest = f.path[len(prefix):]
                if "/" in rest and not recursive:
                    dirs.add(prefix + rest.split("/", 1)[0])
                    continue
                e = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
                if f.lfs:
                    e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": _lfs_pointer_size(f.sha256, f.size)}
                entries.append(e)
            entries += [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
                        for d in sorted(dirs)]
            if sub and not entries:
                return self.error(404, "EntryNotFound", f"{sub} does not exist at {revision}", head)
            return self.json(entries, head)

        def resolve(self, repo_id: str, revision: str, path: str, head: bool):
            repo = self.repo_at(repo_id, revision, head)
            if repo is None:
                return
            f = repo.files.get(path)
            if f is None:
                return self.error(404, "EntryNotFound", f"{path} does not exist at {revision}", head)
            common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
            if f.lfs:
                return self.answer(302, {**common, "Location": hub.sign(repo_id, path), "ETag": f'"{f.blob_id}"',
                                         "X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": f.size}, head=head)
            self.send_file(repo, f, {**common, "ETag": f'"{f.blob_id}"'}, head, count=False)

        def cdn_get(self, parts: list, query: dict, head: bool):
            if len(parts) < 4 or parts[0] != "repos":
                return self.error(404, "EntryNotFound", "not a CDN object", head)
            repo_id, path = f"{parts[1]}/{parts[2]}", "/".join(parts[3:])
            repo = hub.repos.get(repo_id)
            f = repo.files.get(path) if repo else None
            if f is None or not hub.signed_ok(repo_id, path, query):
                return self.answer(403, {"Content-Type": "text/plain"}, b"Access denied: bad or expired signature", head)
            self.send_file(repo, f, {"ETag": f'"{f.sha256}"'}, head, count=True)

        def send_file(self, repo: HubRepo, f: HubFile, headers: dict, head: bool, count: bool):
            start = 0
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes=") and rng[6:].endswith("-") and rng[6:-1].isdigit():
                start = int(rng[6:-1])
                if start >= f.size:
                    return self.answer(416, {"Content-Range": f"bytes */{f.size}"}, head=head)
            status = 206 if start else 200
            if start:
                headers = {**headers, "Content-Range": f"bytes {start}-{f.size - 1}/{f.size}"}
            with hub.lock:
                hub.calls.append((self.command, urlsplit(self.path).path, status))
            self.send_response(status)
            for k, v in {**headers, "Content-Type": "application/octet-stream"}.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(f.size - start))
            self.end_headers()
            if head:
                return
            with open(repo.directory / f.path, "rb") as src:
                src.seek(start)
                for piece in iter(lambda: src.read(PIECE), b""):
                    if count:  # counted before it is sent, as the calls are
                        with hub.lock:
                            hub.served[(repo.repo_id, f.path)] += len(piece)
                    self.wfile.write(piece)

    return Handler


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rehearsal.hub", description=__doc__.split("\n\n")[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--repo", required=True, help="the repository id it is served as, ORG/NAME")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--cdn-port", type=int, default=0)
    a = p.parse_args(argv)
    hub = StandinHub(os.environ.get("REHEARSAL_HUB_TOKEN") or None, a.bind, a.port, a.cdn_port)
    commit = hub.add(a.repo, a.directory)
    hub.start()
    print(json.dumps({"endpoint": hub.endpoint, "repo": a.repo, "commit": commit, "token": hub.token is not None}),
          flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
