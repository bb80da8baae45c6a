"""PythonVenv: the serving venv on the host (components/core/venv.py parses and decides;
components/remote/installers.py installs). The wheelhouse is read here, on this machine."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import pulumi
from pulumi.dynamic import Resource

from .core.config import StackSettings, VenvSettings
from .core.errors import ConfigError, SettingError
from .core.cache import cache_root
from .core.specs_install import LocalFiles, VenvSpec
from .core.venv import (
    DIST_SUFFIXES,
    INSTALL_TIMEOUT,
    OUTPUT_KEYS,
    REHEARSAL,
    WHEELHOUSE_DIR,
    wheelhouse_problems,
)
from .gpu_host import GpuHost
from .resources import MODULE, dynamic_options, wait_in_children
from .remote import rehearsal_adapter
from .remote.installers import PythonVenvProvider

# --------------------------------------------------------------------------------------------
# The component


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheelhouse_of(venv: VenvSettings) -> Optional[LocalFiles]:
    """The wheels pushed to the host (each with its sha256), or None (packages from the host's
    index). Raises ConfigError naming the setting."""
    setting = venv.wheelhouse
    if setting is None:
        return None
    if setting == REHEARSAL:
        try:
            files = [rehearsal_adapter.engine_wheel(cache_root())]
            local = files[0].parent
        except Exception as exc:  # the message is what to fix
            raise ConfigError([SettingError("gpu-serving:venv.wheelhouse", f"building the rehearsal engine wheel failed: {exc}")]) from None
        where = "rehearsal (the rehearsal engine wheel)"
    else:
        local = Path(setting).expanduser()
        if not local.is_absolute():
            local = Path.cwd() / local
        if not local.is_dir():
            raise ConfigError([SettingError("gpu-serving:venv.wheelhouse", f"{local} is not a directory",
                                            f"a local directory of wheels, or {REHEARSAL!r}")])
        files = sorted(p for p in local.iterdir() if p.is_file() and p.name.endswith(DIST_SUFFIXES))
        if not files:
            raise ConfigError([SettingError("gpu-serving:venv.wheelhouse", f"{local} holds no wheels (*.whl, *.tar.gz, *.zip)")])
        where = str(local)
    problems = wheelhouse_problems(list(venv.packages), [f.name for f in files], where)
    if problems:
        raise ConfigError(problems)
    return LocalFiles(local_dir=str(local), files={f.name: _sha256(f) for f in files}, remote_dir=WHEELHOUSE_DIR)


def install_props(venv: VenvSettings) -> dict:
    """The provider's inputs for the declared venv (without the connection)."""
    return VenvSpec(path=venv.path, python=venv.python, packages=tuple(venv.packages), wheelhouse=wheelhouse_of(venv),
                    install_timeout=INSTALL_TIMEOUT).to_props()


class _VenvInstall(Resource, module=MODULE, name="PythonVenvInstall"):
    """The dynamic resource (components/remote/installers.py: PythonVenvProvider)."""

    python: pulumi.Output[Optional[str]]
    packages: pulumi.Output[list]
    installed: pulumi.Output[dict]
    pythonPath: pulumi.Output[str]

    def __init__(self, name: str, props: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(PythonVenvProvider(), name, {**props, **{k: None for k in OUTPUT_KEYS}},
                         dynamic_options(opts, ["connection"]))


class PythonVenv(pulumi.ComponentResource):
    """The serving venv. Outputs: ``python`` (the venv's interpreter, e.g.
    /root/venv_sglang211/bin/python) and ``packages`` ({name: installed version})."""

    python: pulumi.Output[str]
    packages: pulumi.Output[dict]

    def __init__(self, name: str, host: GpuHost, settings: StackSettings, opts: Optional[pulumi.ResourceOptions] = None):
        opts, after = wait_in_children(opts)
        super().__init__("gpu-serving:index:PythonVenv", name, {}, opts)
        try:
            props = install_props(settings.venv)
        except ConfigError as exc:
            raise pulumi.RunError(str(ConfigError(exc.errors, f"stack {settings.stack}"))) from None
        # A dynamic provider with a real read (the venv's python and pip list): a broken or
        # changed venv is drift; delete is a no-op (and retained), the other stacks use it.
        self.install = _VenvInstall(f"{name}-packages", {"connection": host.connection, **props},
                                    pulumi.ResourceOptions(parent=self, retain_on_delete=True, depends_on=after))
        self.python = self.install.pythonPath
        self.packages = self.install.installed
        self.register_outputs({"python": self.python, "packages": self.packages})
