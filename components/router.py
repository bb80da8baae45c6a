"""Router: SGLang's router (smg) on one machine of the fleet, in a venv of its own installed
offline from the pinned wheels (components/core/data/router/, fetched by scripts/router-wheels
into the cache), run by a systemd unit whose file and environment file are drift-checked like
the serving units' (RemoteFile), and started by RouterServiceProvider. The pure parts are in
components/core/router.py, the admin API calls in components/remote/router.py."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pulumi

from .core import router as R
from .core.cache import cache_root
from .core.config import RouterSettings, StackSettings
from .core.errors import ConfigError, SettingError
from .core.specs import file_spec
from .core.specs_install import LocalFiles, VenvSpec
from .core.specs_router import RouterAdminAccess, RouterServiceSpec
from .core.unit import UNIT_DIR
from .core.venv import INSTALL_TIMEOUT, distribution_of, normalize, parse_requirement, wheelhouse_problems
from .gpu_host import GpuHost
from .resources import RemoteFile, RouterService
from .venv import _sha256, _VenvInstall

# Where the router's wheels go on its host (apart from the serving wheelhouse: each venv's
# pip sees only its own pins).
REMOTE_WHEELHOUSE = "/var/lib/gpu-serving/router-wheelhouse"


def local_wheelhouse(router: RouterSettings) -> Path:
    if router.wheelhouse:
        local = Path(router.wheelhouse).expanduser()
        return local if local.is_absolute() else Path.cwd() / local
    return cache_root() / "router" / "wheelhouse"


def wheelhouse_of(router: RouterSettings) -> LocalFiles:
    """The pinned wheels of router.version found in the local wheelhouse (each with its sha256),
    pushed to REMOTE_WHEELHOUSE. Raises ConfigError naming gpu-serving:router.wheelhouse."""
    local = local_wheelhouse(router)
    specs = R.pins(router.version)
    files = sorted(p for p in local.iterdir() if p.name.endswith(".whl")) if local.is_dir() else []
    problems = wheelhouse_problems(specs, [f.name for f in files], str(local))
    if problems:
        missing = ", ".join(e.rule.split(" has no wheel")[0] for e in problems)
        raise ConfigError([SettingError("gpu-serving:router.wheelhouse", f"{local} lacks {missing}",
                                        f"run scripts/router-wheels {router.version} (pip download of the pinned set), "
                                        "or point router.wheelhouse at a directory holding them")])
    wanted = set()
    for spec in specs:
        pkg, _, version = parse_requirement(spec)
        wanted.add((normalize(pkg), version))
    chosen = [f for f in files if distribution_of(f.name) in wanted]
    return LocalFiles(local_dir=str(local), files={f.name: _sha256(f) for f in chosen}, remote_dir=REMOTE_WHEELHOUSE)


def install_props(router: RouterSettings) -> dict:
    return VenvSpec(path=router.venv_path, python="3.11", packages=tuple(R.pins(router.version)),
                    wheelhouse=wheelhouse_of(router), install_timeout=INSTALL_TIMEOUT).to_props()


class Router(pulumi.ComponentResource):
    """The router. Outputs: ``url`` (where clients send requests) and ``workers`` (each serving
    host's URL and the strategy the router reads off it)."""

    url: pulumi.Output[str]
    workers: pulumi.Output[list]

    def __init__(self, name: str, host: GpuHost, settings: StackSettings, workers: list[str], admin_key: pulumi.Output,
                 opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpu-serving:index:Router", name, {}, opts)
        r = settings.declared_router
        try:
            props = install_props(r)
        except ConfigError as exc:
            raise pulumi.RunError(str(ConfigError(exc.errors, f"stack {settings.stack}"))) from None
        # Every strategy stack of the fleet declares the same router: destroying one stack leaves
        # it routing for the others (like the venvs; remove it by hand when the fleet goes).
        child = pulumi.ResourceOptions(parent=self, retain_on_delete=True)
        # Shared by every strategy stack of the fleet, like the serving venv: kept on destroy.
        self.install = _VenvInstall(f"{name}-packages", {"connection": host.connection, **props},
                                    pulumi.ResourceOptions(parent=self, retain_on_delete=True))
        # The key entry is the secret part: written into the file by the provider, never shown.
        self.environment_file = RemoteFile(f"{name}-environment-file", file_spec(
            host.connection, R.environment_path(settings),
            "# Managed by gpu-serving: the router's admin key (gpu-serving:routerAdminKey, a Pulumi secret).\n", "0600",
            secretEnvironment=admin_key.apply(lambda k: {R.KEY_VARIABLE: f"{R.KEY_ID}:{R.KEY_ID}:admin:{k}"}),
        ).to_props(), child)
        self.unit_file = RemoteFile(f"{name}-unit-file", file_spec(
            host.connection, f"{UNIT_DIR}/{R.unit_name(settings)}", R.render_unit(settings, workers), "0644",
            reloadSystemd=True, showWhenNew=True,
        ).to_props(), child)
        self.service = RouterService(f"{name}-service", RouterServiceSpec(
            access=RouterAdminAccess(host.connection, r.bind, r.port, r.venv_path, admin_key),
            unit=R.unit_name(settings), unit_text=R.render_unit(settings, workers),
        ).to_props(), pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            depends_on=[self.install, self.environment_file, self.unit_file])))
        self.url_text = R.worker_url(host.address if r.bind in ("0.0.0.0", "::") else r.bind, r.port)
        self.url = pulumi.Output.from_input(self.url_text)
        self.register_outputs({"url": self.url})
