"""components/core/cache.py: one root for what gpu-serving caches on this machine."""
from pathlib import Path

from components.core.cache import DEFAULT, cache_root


def test_the_cache_root_is_the_variable_or_the_default_and_is_read_when_asked(monkeypatch):
    assert cache_root({}) == Path(DEFAULT) == Path("/var/cache/gpu-serving")
    assert cache_root({"GPU_SERVING_CACHE": "/srv/cache"}) == Path("/srv/cache")
    assert cache_root({"GPU_SERVING_CACHE": ""}) == Path(DEFAULT)  # set but empty: the default, as scripts/setup reads it
    monkeypatch.setenv("GPU_SERVING_CACHE", "/tmp/elsewhere")
    assert cache_root() == Path("/tmp/elsewhere")
