"""pydantic edge cases: types, ranges, unknown keys, profiles, safe characters."""
import pytest

from components.config import parse_settings
from components.errors import ConfigError

# A real ed25519 public key (generated for these tests; public, no secret).
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBk5Cd7Ad55IN5VS2Wro6PHRmPTvaG4gJLQZKW5EjmqI"
BASE = {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8}}


def errors_of(config):
    with pytest.raises(ConfigError) as info:
        parse_settings("t", config)
    return {e.setting: str(e) for e in info.value.errors}


def test_defaults_reproduce_the_scenario():
    s = parse_settings("ep8", {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8, "epSize": 8}})
    assert (s.serving.port, s.serving.mem_fraction_static, s.serving.context_length) == (30001, 0.88, 32768)
    assert (s.serving.max_running_requests, s.serving.attention_backend, s.serving.grammar_backend) == (64, "triton", "none")
    assert s.serving.trust_remote_code and s.serving.host == "0.0.0.0"
    assert (s.host.gpu_count, s.host.gpu_memory_gb, s.host.interconnect) == (8, 96, "pcie")
    assert s.host.is_rehearsal and s.host.address is None
    assert s.cuda.home == "/usr/local/cuda-13.0" and s.cuda.apt_package == "cuda-toolkit-13-0"
    assert s.venv.path == "/root/venv_sglang211"
    assert s.strategy_name == "ep8"


def test_profile_numbers_and_override():
    s = parse_settings("t", {"model": {"profile": "kimi-k2.6", "weightsGb": 600}, "strategy": {"tpSize": 8}})
    assert (s.model.num_layers, s.model.num_experts, s.model.kv_lora_rank, s.model.weights_gb) == (61, 384, 512, 600)
    assert s.model.path == "/models/kimi-k2.6" and s.model.served_name == "kimi-k2.6"
    d = parse_settings("t", {"model": {"profile": "deepseek-v3"}})
    assert d.model.num_experts == 256


def test_unknown_profile_lists_the_known_ones():
    errs = errors_of({"model": {"profile": "kimi-k3"}})
    assert "built-in profiles" in errs["gpu-serving:model.profile"] and "kimi-k2.6" in errs["gpu-serving:model.profile"]
    assert len(errs) == 1, errs  # not buried under "numLayers is required" and the like


def test_model_without_name_or_profile():
    errs = errors_of({"model": {}})
    assert "gpu-serving:model" in errs


def test_custom_model_missing_numbers_are_named():
    errs = errors_of({"model": {"name": "mine"}})
    assert "gpu-serving:model.numLayers" in errs and "gpu-serving:model.weightsGb" in errs


def test_typo_in_key_suggests_the_right_one():
    errs = errors_of({**BASE, "strategy": {"tpsize": 8}})
    assert "did you mean 'tpSize'" in errs["gpu-serving:strategy.tpsize"]


def test_unknown_top_level_setting():
    errs = errors_of({**BASE, "servng": {}})
    assert "did you mean gpu-serving:serving" in errs["gpu-serving:servng"]


@pytest.mark.parametrize("section,key,value", [
    ("strategy", "tpSize", "eight"),
    ("strategy", "tpSize", 0),
    ("strategy", "epSize", -1),
    ("serving", "port", 70000),
    ("serving", "port", 22),
    ("serving", "memFractionStatic", 1.2),
    ("serving", "memFractionStatic", 0),
    ("serving", "contextLength", 0),
    ("serving", "host", "my host"),
    ("serving", "attentionBackend", "flash"),
    ("serving", "grammarBackend", "xgrammer"),
    ("serving", "unitPrefix", "sglang service"),
    ("serving", "unitPrefix", "-x"),
    ("serving", "environment", {"BAD KEY": "1"}),
    ("serving", "environment", {"A": "x\ny"}),
    ("serving", "environment", {"A": "$(reboot)"}),
    ("serving", "extraArgs", ["--foo", "a b"]),
    ("serving", "extraArgs", ["--foo=`id`"]),
    ("serving", "extraArgs", "--foo"),
    ("host", "address", "10.0.0.1; rm -rf /"),
    ("host", "port", 0),
    ("host", "gpuCount", 0),
    ("host", "interconnect", "infiniband"),
    ("host", "hostKey", "not a key"),
    ("host", "user", "root;id"),
    ("model", "path", "/models/kimi k2"),
    ("model", "path", "relative/path"),
    ("model", "servedName", "kimi'k2"),
    ("model", "name", "kimi/../../etc"),
    ("cuda", "version", "13"),
    ("cuda", "install", "yum"),
    ("venv", "packages", ["sglang"]),
    ("venv", "packages", ["sglang>=0.5"]),
    ("venv", "packages", []),
    ("venv", "path", "/root/venv sglang"),
    ("readiness", "timeoutSeconds", -5),
])
def test_bad_value_names_the_setting(section, key, value):
    config = {**BASE, section: {**({"profile": "kimi-k2.6"} if section == "model" else {}), key: value}}
    errs = errors_of(config)
    assert any(s.startswith(f"gpu-serving:{section}.{key}") for s in errs), errs


def test_section_of_the_wrong_type():
    errs = errors_of({**BASE, "serving": ["port", 1]})
    assert "must be an object" in errs["gpu-serving:serving"]


def test_numbers_in_environment_become_text():
    s = parse_settings("t", {**BASE, "serving": {"environment": {"NCCL_IB_DISABLE": 1, "FLAG": True}}})
    assert s.serving.environment == {"NCCL_IB_DISABLE": "1", "FLAG": "true"}


def test_all_errors_reported_at_once():
    errs = errors_of({"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": "x"}, "serving": {"port": 1}})
    assert len(errs) == 2


def test_valid_real_host():
    s = parse_settings("t", {**BASE, "host": {"address": "gpu-box-1.example.internal", "user": "ubuntu",
                                              "hostKey": HOST_KEY}})
    assert not s.host.is_rehearsal
