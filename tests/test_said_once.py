"""A fleet's hosts print a text they would each print the same once: the first in full, the others
naming it (components/remote/said.py); the one-host form always in full."""
from __future__ import annotations

from components.remote import said

UNIT = "[Unit]\nDescription=SGLang kimi-k2.6 tp8\n[Service]\nExecStart=/x\n"


def test_the_first_host_prints_the_unit_and_the_others_name_it():
    path = "/etc/systemd/system/pt-said-tp8.service"
    assert said.new_file("hosts[gpu1]: ", path, UNIT) == f"hosts[gpu1]: {path} as it will be written:\n{UNIT}".rstrip("\n")
    assert said.new_file("hosts[gpu2]: ", path, UNIT) == (f"hosts[gpu2]: {path} as it will be written: the same text as "
                                                          "hosts[gpu1]'s above")
    # Another text (another host's hardware, another plan) is printed in full.
    assert said.new_file("hosts[gpu3]: ", path, UNIT + "X=1\n").endswith("X=1")
    # The same host asked again (the update after its preview, in one process) prints it in full again.
    assert said.new_file("hosts[gpu1]: ", path, UNIT).endswith("ExecStart=/x")


def test_the_one_host_form_always_prints_it():
    path = "/etc/systemd/system/pt-said-one.service"
    assert said.new_file("", path, UNIT) == said.new_file("", path, UNIT) == f"{path} as it will be written:\n{UNIT}".rstrip("\n")
