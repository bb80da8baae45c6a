"""gpu-serving:model.source and model.hubEndpoint: where a host's checkpoint comes from.

Four forms, parsed here before anything reaches a host:

- ``verify`` (the default, what every stack did before sources existed): the directory
  model.path must already be on the host; it is checked, never written;
- ``host:<entry>:<path>``: copied from a machine listed under gpu-serving:hosts (a cache host or
  a fleet peer) that holds the checkpoint at <path>, host to host over SSH;
- ``local:<path>``: copied from this machine (the one that runs pulumi);
- ``hub:<org>/<name>@<commit>``: the Hugging Face Hub (or the mirror model.hubEndpoint names)
  through its own client on the host, pinned to a commit: a branch or tag moves, so two hosts or
  two runs could get different weights. The token is gpu-serving:hfToken (a Pulumi secret).

`parse` is the per-value rule (config.py calls it as the field's check); `check` ties the
source to the other settings (the hosts entry it names, the controller's disk, model.path).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Collection, Optional

from .errors import SettingError, shown
from .rules import NAMESPACE, rx

# Longest model.source (a hosts entry name, 64, and a path, 1024, fit with room).
MAX_SOURCE = 1200
MAX_ENDPOINT = 512
KINDS = ("verify", "host", "local", "hub")
# The sources this version stages. The others are parsed and checked in full (a stack file
# written now stays valid), then refused: nothing would copy the checkpoint yet
# (docs/weights-design.md), and a setting that would do nothing is refused, not ignored.
STAGED = ("verify",)

_NAME = rx(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_PATH = rx(r"/[A-Za-z0-9_./+-]*")
# A Hub repository id as the Hub's client validates it (utils/_validators.py): namespace/name,
# ASCII letters, digits, - _ ., not starting or ending with - or ., at most 96 a part.
_REPO_PART = rx(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?")
# A commit as the client recognises one (REGEX_COMMIT_HASH): 40 lower-case hex digits.
_COMMIT = rx(r"[0-9a-f]{40}")
# http(s)://host[:port][/path]: no user or password (a token goes in gpu-serving:hfToken), no
# query, nothing a shell or a unit file would read.
_ENDPOINT = rx(r"https?://(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/-]*)?")

FORMS = ("verify (the directory is already on the host), host:<hosts entry>:<path>, "
         "local:<path on this machine>, or hub:<org>/<name>@<40-hex commit>")
COMMIT_HOWTO = ("pin the commit the revision points at now (a branch or tag moves: two hosts or two runs could get "
                "different weights): python -c \"from huggingface_hub import HfApi; "
                "print(HfApi().model_info('ORG/NAME', revision='main').sha)\"")
# Files the host-side tools leave inside the checkpoint directory (huggingface_hub's local_dir
# metadata): never part of a checkpoint.
TOOL_DIRS = (".cache",)


@dataclass(frozen=True)
class ModelSource:
    """A parsed model.source. `entry`/`path` for host:, `path` for local:, `repo`/`revision` for hub:."""

    kind: str
    entry: Optional[str] = None
    path: Optional[str] = None
    repo: Optional[str] = None
    revision: Optional[str] = None

    @property
    def writes(self) -> bool:
        """Whether `up` may write the checkpoint directory (verify only reads it)."""
        return self.kind != "verify"

    def __str__(self) -> str:
        if self.kind == "host":
            return f"host:{self.entry}:{self.path}"
        if self.kind == "local":
            return f"local:{self.path}"
        if self.kind == "hub":
            return f"hub:{self.repo}@{self.revision}"
        return "verify"


def _canonical_path(path: str, what: str) -> str:
    if not _PATH.fullmatch(path):
        if not path.startswith("/"):
            raise ValueError(f"the {what} {shown(path)} is relative: write the absolute path, e.g. /models/kimi-k2.6")
        raise ValueError(f"the {what} {shown(path)} is not an absolute path without spaces, quotes or shell characters")
    segments = path.split("/")[1:]
    if path != "/" and (path.endswith("/") or any(s in ("", ".", "..") for s in segments)):
        canonical = "/" + "/".join(_resolved(segments))
        raise ValueError(f"the {what} {shown(path)} is not written in canonical form (no '.', '..' or empty segments, "
                         f"no trailing '/'): write {shown(canonical)}")
    if path == "/":
        raise ValueError(f"the {what} is '/': name the checkpoint's own directory, e.g. /models/kimi-k2.6")
    return path


def _resolved(segments: list[str]) -> list[str]:
    out: list[str] = []
    for s in segments:
        if s in ("", "."):
            continue
        if s == "..":
            if out:
                out.pop()
        else:
            out.append(s)
    return out


def parse(value: str) -> ModelSource:
    """The source `value` names; ValueError saying which rule it breaks and what to write."""
    if value == "verify":
        return ModelSource("verify")
    kind, sep, rest = value.partition(":")
    if not sep or kind not in KINDS[1:]:
        raise ValueError(f"{shown(value)} is not a model source: use {FORMS}")
    if kind == "host":
        entry, sep, path = rest.partition(":")
        if not sep or not entry:
            raise ValueError(f"{shown(value)} names no hosts entry and path: write host:<hosts entry>:<path>, "
                             "e.g. host:cache1:/models/kimi-k2.6")
        if not _NAME.fullmatch(entry):
            raise ValueError(f"the source host {shown(entry)} is not a hosts entry name (letters, digits, . _ -)")
        return ModelSource("host", entry=entry, path=_canonical_path(path, "source path"))
    if kind == "local":
        return ModelSource("local", path=_canonical_path(rest, "local path"))
    repo, sep, revision = rest.partition("@")
    if not sep:
        raise ValueError(f"{shown(value)} pins no revision: write hub:<org>/<name>@<commit>; {COMMIT_HOWTO}")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(p) for p in parts) or "--" in repo or ".." in repo \
            or repo.endswith(".git"):
        raise ValueError(f"{shown(repo)} is not a Hub repository id: <org>/<name>, letters, digits, - _ ., "
                         "neither starting nor ending with - or ., at most 96 each, no -- or ..")
    if not _COMMIT.fullmatch(revision):
        raise ValueError(f"the revision {shown(revision)} is not a commit hash (40 lower-case hex digits); {COMMIT_HOWTO}")
    return ModelSource("hub", repo=repo, revision=revision)


def checked(value: str) -> str:
    """model.source's field check (config.py): the value, once `parse` accepts it."""
    parse(value)
    return value


def endpoint(value: str) -> str:
    """model.hubEndpoint's field check: an http(s) base URL of a Hub-compatible server."""
    if "@" in value.partition("://")[2].partition("/")[0]:
        raise ValueError("holds a user or password: the endpoint is a plain URL; the token goes only as the secret "
                         "gpu-serving:hfToken")
    if not _ENDPOINT.fullmatch(value):
        raise ValueError(f"{shown(value)} is not an http(s) base URL like https://hub.example.internal or "
                         "http://10.0.0.5:8080 (host, optional port and path; no query, spaces or quotes)")
    return value


def check(model: Any, hosts: tuple[Any, ...], system_dirs: Collection[str], exists: Callable[[str], bool] = os.path.isdir,
          is_file: Callable[[str], bool] = os.path.isfile) -> list[SettingError]:
    """model.source against the rest of the stack, before any SSH: the hosts entry it names, the
    controller's directory, model.hubEndpoint only with hub:, and a directory of its own to write.
    `model`: the parsed ModelSettings (None when it was refused); `hosts`: gpu-serving:hosts (their
    models are defined above this module, which they import)."""
    if model is None:
        return []
    where = f"{NAMESPACE}:model.source"
    source = parse(model.source)
    errors: list[SettingError] = []
    if model.hub_endpoint is not None and source.kind != "hub":
        errors.append(SettingError(f"{NAMESPACE}:model.hubEndpoint", f"is set but model.source is {source}: only a hub: "
                                   "source downloads from it (a setting that would be ignored is refused)",
                                   "remove model.hubEndpoint, or set model.source: hub:<org>/<name>@<commit>"))
    if source.kind == "host":
        names = [h.name for h in hosts]
        if source.entry not in names:
            fix = (f"name one of {', '.join(names)}, or add the machine that holds the checkpoint to gpu-serving:hosts"
                   if names else "list the machine that holds the checkpoint under gpu-serving:hosts (with the "
                   "serving hosts), or copy from this machine: local:<path>")
            errors.append(SettingError(where, f"the source host {source.entry!r} is not a gpu-serving:hosts entry", fix))
    elif source.kind == "local" and source.path is not None:  # a local: source has its path
        if not exists(source.path):
            errors.append(SettingError(where, f"{source.path} does not exist on this machine (the one that runs pulumi, "
                                       "where local: copies from)", "give the checkpoint directory's path here, or use "
                                       "host:<entry>:<path> for a copy that is on another machine"))
        elif not is_file(os.path.join(source.path, "config.json")):
            errors.append(SettingError(where, f"{source.path} holds no config.json: not a checkpoint directory",
                                       "name the directory that holds config.json and the *.safetensors shards"))
    if source.kind not in STAGED and not any(e.setting == where for e in errors):
        errors.append(SettingError(where, f"{source.kind}: sources are checked but not staged by this version: nothing "
                                   "would copy the checkpoint to the host (docs/weights-design.md)", "copy the checkpoint "
                                   f"to model.path ({model.path}) on every host yourself and leave model.source at verify"))
    if source.writes and model.path in system_dirs:
        errors.append(SettingError(f"{NAMESPACE}:model.path", f"{model.path} is a system directory and model.source "
                                   f"{source.kind}: writes the checkpoint there", "give the checkpoint a directory of "
                                   f"its own, e.g. /models/{model.name}"))
    return errors
