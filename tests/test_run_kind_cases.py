"""Which run of a `pulumi` command says what a preview says (components/core/run_kind.py, issue
36.18), as data: the command's arguments in, whether a preview came before its update out
(tests/data/run-kind/*.json); and the CLI's arguments as components/remote/cli.py reads them."""
import os
import shutil
import subprocess
import sys

import pytest

from components.core.run_kind import preview_came_first, says_preview_things
from components.remote import cli

from .casedata import cases

CASES = cases("run-kind")


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_preview_came_first(name, case):
    assert preview_came_first(case["args"]) is case["preview_came_first"]
    # A preview always says it; an update only when no preview of its command did.
    assert says_preview_things(True, case["args"]) is True
    assert says_preview_things(False, case["args"]) is (not case["preview_came_first"])


def test_the_command_line_of_a_pulumi_ancestor_is_found(tmp_path):
    """A process whose parent or grandparent runs an executable named `pulumi` (the program's
    runner is the language host's child, itself the CLI's): that process's arguments; none
    without such an ancestor."""
    fake = tmp_path / "pulumi"
    shutil.copy("/bin/sh", fake)  # an executable whose /proc/<pid>/exe is named pulumi
    script = f'sh -c "{sys.executable} -c \\"from components.remote import cli; print(cli.pulumi_command_line())\\"; true"; true'
    out = subprocess.run([str(fake), "-c", script, "up", "--yes", "--skip-preview"], capture_output=True, text=True,
                         timeout=60, cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr(["-c", script, "up", "--yes", "--skip-preview"]), out.stdout
    assert cli.pulumi_command_line() is None  # pytest's ancestors run no `pulumi`


def test_the_first_run_of_a_command_says_it_and_the_next_does_not(tmp_path):
    """The provider's side (the engine starts one provider process a run): the first process of a
    command to ask leaves a marker named after the CLI process, the next one finds it; a marker
    of a CLI that is gone is swept."""
    base = tmp_path / "markers"
    base.mkdir(mode=0o700)
    me = os.getpid()
    assert cli.first_run_of_command(me, str(base)) is True   # the preview's provider
    assert cli.first_run_of_command(me, str(base)) is False  # the update's
    (base / f"{cli.MARKER_PREFIX}999999999-12345").touch()   # a CLI long gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert cli.first_run_of_command(int(dead.stdout), str(base)) is True  # a pid without a process: cannot say
    assert sorted(p.name for p in base.iterdir()) == [f"{cli.MARKER_PREFIX}{me}-{cli._started(me)}"]
