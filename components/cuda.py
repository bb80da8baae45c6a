"""CudaToolkit: the declared CUDA toolkit on the host (components/core/cuda.py says how it is
installed and decides what to do; components/remote/installers.py does it)."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pulumi
from pulumi.dynamic import Resource

from .core.config import CudaSettings, StackSettings
from .core.cuda import INSTALL_TIMEOUT, REHEARSAL, settings_problems
from .core.errors import ConfigError, SettingError
from .core.specs_install import CudaSpec, LocalFiles
from .gpu_host import GpuHost
from .resources import MODULE, dynamic_options, wait_in_children
from .remote import rehearsal_adapter
from .remote.installers import CudaToolkitProvider

# --------------------------------------------------------------------------------------------
# The component


class _CudaInstall(Resource, module=MODULE, name="CudaToolkitInstall"):
    """The dynamic resource (components/remote/installers.py: CudaToolkitProvider)."""

    version: pulumi.Output[Optional[str]]
    home: pulumi.Output[str]
    nvccRelease: pulumi.Output[Optional[str]]
    sourceLine: pulumi.Output[Optional[str]]

    def __init__(self, name: str, props: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(CudaToolkitProvider(), name, {**props, "nvccRelease": None, "sourceLine": None},
                         dynamic_options(opts, ["connection"]))


def install_props(cuda: CudaSettings) -> dict:
    """The provider's inputs for the declared toolkit (without the connection). For the
    rehearsal repository, builds it (cached) and pins its keyring."""
    spec = CudaSpec(version=cuda.version, home=cuda.home, install=cuda.install, apt_package=cuda.apt_package,
                    apt_repository=cuda.apt_repository, keyring_sha256=cuda.keyring_sha256, install_timeout=INSTALL_TIMEOUT)
    if cuda.install == "apt" and cuda.apt_repository == REHEARSAL:
        try:
            info = rehearsal_adapter.cuda_repo(cuda.version)
        except rehearsal_adapter.BuildFailed as exc:
            raise ConfigError([SettingError("gpu-serving:cuda.aptRepository",
                                            f"the rehearsal repository could not be built: {exc}")]) from None
        if cuda.keyring_sha256 and cuda.keyring_sha256 != info.keyring_sha256:
            raise ConfigError([SettingError(
                "gpu-serving:cuda.keyringSha256", f"does not match the rehearsal repository's keyring ({info.keyring_sha256})",
                "leave it out with aptRepository: rehearsal (the keyring built on this machine is pinned)")])
        if info.package != cuda.apt_package.split("=", 1)[0]:
            raise ConfigError([SettingError("gpu-serving:cuda.aptPackage", f"the rehearsal repository has only {info.package}",
                                            "leave aptPackage out with aptRepository: rehearsal")])
        # The pin is the keyring built here: the provider checks the file it pushes against it,
        # by the same code path as NVIDIA's.
        spec = replace(spec, keyring_sha256=info.keyring_sha256,
                       rehearsal_repo=LocalFiles(local_dir=info.directory, keyring_file=info.keyring,
                                                 remote_dir=rehearsal_adapter.CUDA_REPO_DIR))
    return spec.to_props()


class CudaToolkit(pulumi.ComponentResource):
    """The declared CUDA toolkit on the host. Outputs: ``version`` (what ``<home>/bin/nvcc
    --version`` reports, e.g. "13.0") and ``home`` (e.g. /usr/local/cuda-13.0)."""

    version: pulumi.Output[Optional[str]]
    home: pulumi.Output[str]

    def __init__(self, name: str, host: GpuHost, settings: StackSettings, opts: Optional[pulumi.ResourceOptions] = None):
        opts, after = wait_in_children(opts)
        super().__init__("gpu-serving:index:CudaToolkit", name, {}, opts)
        problems = settings_problems(settings.cuda)
        try:
            if problems:
                raise ConfigError(problems, f"stack {settings.stack}")
            props = install_props(settings.cuda)
        except ConfigError as exc:
            raise pulumi.RunError(str(exc)) from None
        # A dynamic provider rather than pulumi_command.remote.Command: Command has no read, so a
        # toolkit removed by hand would never show on refresh and `up` could not tell "installed"
        # from "ran once". The provider reads `nvcc --version`, installs only when that differs,
        # and its delete is a no-op (retain_on_delete too): the other strategy stacks use CUDA.
        self.install = _CudaInstall(f"{name}-toolkit", {"connection": host.connection, **props},
                                    pulumi.ResourceOptions(parent=self, retain_on_delete=True, depends_on=after))
        self.version = self.install.version
        self.home = self.install.home
        self.register_outputs({"version": self.version, "home": self.home})
