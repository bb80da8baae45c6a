"""A dynamic provider for tests/integration/test_language_host.py: each create waits until
`PARTIES` creates are being served at once (a barrier in the provider process)."""
import threading

from pulumi.dynamic import CreateResult, ResourceProvider

PARTIES = 8
_all_in = threading.Barrier(PARTIES, timeout=15)


class WaitForAll(ResourceProvider):
    def create(self, props):
        _all_in.wait()  # BrokenBarrierError when fewer than PARTIES calls can run at once
        return CreateResult(id_=str(int(props["n"])), outs={"n": props["n"]})
