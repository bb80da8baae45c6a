"""What the project's warm process loads once for every run (Pulumi.yaml `runtime.options.warmStart`).

Each `pulumi preview` starts two Python processes (the program and the dynamic provider) and each
`pulumi up` four, and each spent ~0.5-0.7 s importing the same modules: the Pulumi SDK and grpc,
pydantic and the settings models, the program's components, the providers and paramiko
(docs/benchmarks.md, issue 18). Our runner (scripts/pulumi-build/language-python/gpu-serving-pyrun.py,
`_gs_warm`) keeps one process per project that has imported this module, and runs each program
and provider in a fork of it: the run starts with all of it loaded.

Only imports here, nothing that reads the stack, the environment or a host: what a module does as
it is imported happens once, in the warm process, and every run shares it. A run that imports
something else still imports it itself; an edited module makes the warm process stale (it stops,
that run goes cold, the next starts a fresh one).
"""
import argparse  # noqa: F401 - the SDK's program runner (pulumi-language-python-exec) parses its arguments with it
import runpy  # noqa: F401 - it runs the program with it

import pulumi  # noqa: F401
import pulumi.dynamic  # noqa: F401
import pulumi.dynamic.dynamic  # noqa: F401 - the provider unpickles its resources' providers through it
import pulumi.runtime  # noqa: F401

import components.program  # noqa: F401 - the program: settings models, plan, components
import components.remote.ahead  # noqa: F401 - the provider's own calls
import components.remote.providers  # noqa: F401 - every resource's provider
from components.remote import ssh

ssh.load()  # paramiko, imported lazily by the program (which does not connect) and at once by the provider
