"""Stand-in CUDA apt repository for rehearsal hosts (see repo.py).

    from rehearsal.cuda import build_repo
    info = build_repo("13.0")   # RepoInfo: repo_dir, keyring, keyring_sha256, package, ...

Command line: ``python -m rehearsal.cuda [--version 13.0] [--force]`` prints the RepoInfo as JSON.
"""
from .repo import RepoBuildError, RepoInfo, build_repo, package_name, repo_root

__all__ = ["RepoBuildError", "RepoInfo", "build_repo", "package_name", "repo_root"]
