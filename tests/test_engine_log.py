"""A provider's messages to the engine (components/remote/engine_log.py): only in the dynamic
provider's server process, to the engine address it was launched with; anywhere else stderr."""
import pytest

from components.remote import engine_log
from components.remote.common import progress

SERVER = "pulumi.dynamic.__main__"


@pytest.mark.parametrize("argv,main,expect", [
    (["127.0.0.1:41234"], SERVER, "127.0.0.1:41234"),                        # as the engine launches it
    (["--logtostderr", "-v=9", "127.0.0.1:41234"], SERVER, "127.0.0.1:41234"),  # with its verbose flags first
    (["[::1]:41234"], SERVER, "[::1]:41234"),
    (["localhost:41234"], SERVER, "localhost:41234"),
    (["127.0.0.1:41234"], "__main__", None),                                 # another program: never the engine
    (["tests/test_x.py", "-k", "name"], SERVER, None),                       # no address
    ([], SERVER, None),
])
def test_engine_address(argv, main, expect):
    assert engine_log.engine_address(argv, main) == expect


def test_outside_the_provider_a_block_goes_to_stderr_whole(capsys):
    progress("switch: a serves now\nswitch: it will stop; b starts", ephemeral=False)
    assert capsys.readouterr().err == "switch: a serves now\nswitch: it will stop; b starts\n"
