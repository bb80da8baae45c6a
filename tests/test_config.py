"""pydantic edge cases: types, ranges, unknown keys, profiles, safe characters."""
import pytest

from components.core.config import parse_settings
from components.core.errors import ConfigError

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


# ---------------------------------------------------------------------------------------------
# Messages quote values through errors.shown (issue 13): credentials described, never printed

from components.core.errors import SettingError, secret_kind, shown  # noqa: E402

PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\n" + "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n" * 24
       + "-----END OPENSSH PRIVATE KEY-----\n")


@pytest.mark.parametrize("value,kind", [
    (PEM, "private key"),
    ("hf_" + "Q7xkT2mP9vL4nR8sW3yZ6bC1", "Hugging Face token"),
    ("ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4", "GitHub token"),
    ("github_pat_" + "11ABCDEFG0123456789_abcdefghijkl", "GitHub token"),
    ("sk-" + "proj-Zq8Xw7Vu6Ts5Rq4Po3Nm2Lk1Ji", "API key (sk-...)"),
    ("AKIA" + "IOSFODNN7EXAMPLE", "AWS access key id"),
    ("xoxb-" + "1234567890-abcdefghij", "Slack token"),
    ("Zq8Xw7Vu6Ts5Rq4Po3Nm2Lk1JiHgFeDcBa09", "token-like value"),
])
def test_shown_describes_a_credential_by_length_and_kind(value, kind):
    text = shown(value)
    assert text == f"a {len(value):,}-character {kind} (not shown)"


@pytest.mark.parametrize("value", ["/models/moonshotai/Kimi-K2-Instruct-0905", "mlx5_0,mlx5_1", "kimi-k2.6", "INFO",
                                   "sglang[all]==0.5.23", "/root/.ssh/id_ed25519", "0" * 64, "--max-total-tokens"])
def test_ordinary_values_are_not_taken_for_credentials(value):
    assert secret_kind(value) is None and "not shown" not in shown(value)


def test_shown_escapes_control_characters_and_lookalikes_and_cuts_long_values():
    assert shown("a\nb") == "'a\\nb'"
    assert shown("\u0661\u0663.\u0660") == "'\\u0661\\u0663.\\u0660'"
    long = shown("x" * 10_000_000)
    assert len(long) < 100 and "10,000,000-character" in long


def test_setting_error_redacts_and_bounds_whatever_a_check_wrote():
    token = "hf_" + "Q7xkT2mP9vL4nR8sW3yZ6bC1"
    e = SettingError("gpu-serving:x\nInjected", f"bad value {token!r}\n" + "y" * 100_000, PEM)
    text = str(e)
    assert token not in text and "b3BlbnNz" not in text and "\n" not in text
    assert "Hugging Face token, not shown" in text and len(text) < 2000


def test_config_error_lists_a_bounded_number_of_problems():
    from components.core.errors import ERRORS_SHOWN, MESSAGE_MAX
    err = ConfigError([SettingError(f"gpu-serving:s{i}", "bad") for i in range(500)])
    lines = str(err).splitlines()
    assert len(lines) == ERRORS_SHOWN + 2 and f"{500 - ERRORS_SHOWN} more" in lines[-1]
    # Long problems: the whole message is cut, and says so.
    err = ConfigError([SettingError(f"gpu-serving:s{i}", "x" * 900) for i in range(500)])
    assert len(str(err)) < MESSAGE_MAX + 100 and str(err).endswith("characters)")


# Host keys: checked to be SSH keys of the declared type, before any SSH

# Real public keys generated for these tests (public keys, no secret).
ECDSA_KEY = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBNUTsEEk2h6SdwtBKFu72EnnrX6NqMG+K1lNTURZgD+2KC6UM/KAa72hJ2vIUr7lMowRbFZO1W7zD6PzBcujL8U="  # noqa: E501 - one literal
RSA_KEY = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQCGOhXLKWVx9nlpKMMuQ5KLNpWbVDpiRcXWfXOz6mT6vFBKd02upNcbHDJh1xKzDqF6heZNFRpLMkaJc4C9QcZbG3BzOU5ThF+5fiISBthNyC4MjwmJmaOcjt1tSHqdboHSLDQ1scVDrgz9F+BiErNDfr8St2RVH6tKKNImSeVC6InfR14argTjqhcTRcYmpoH3hEesKs/TK4tfbzXJh4LqFaPEmxNqiKJoxNDHz+pJyXLenArloeMj2MSwG8DsXRQZ8CGoCdfGAs4vq959SHPHEy1OT7SzFl4eP0icblnV5EdUL1meW02rJSQ2P4M8xRDxUh8q706DBrNUUyQX8Ib54MjTYmec+Ghp9gp51c3+6efJabLRQxrpqLUYjm1R/dZOEiP2GfDUlX7TdZfk7Gz6KJ6ifKM29FEOl6ahUiFN7PM66FymdlMdc5hVCi0XXWJ4l6taaaWrkrqyd1QJ/aQvakjyfX2ivbdRJj/rotDI1vbM5BBwfkPxIxc4347UjVs="  # noqa: E501 - one literal


@pytest.mark.parametrize("key", [
    HOST_KEY, ECDSA_KEY, RSA_KEY, "rsa-sha2-512 " + RSA_KEY.split()[1],
])
def test_real_host_keys_are_accepted(key):
    s = parse_settings("t", {**BASE, "host": {"address": "10.0.0.11", "hostKey": key}})
    assert s.host.host_key == key


@pytest.mark.parametrize("key,rule", [
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc0bWs3", "does not decode to an SSH key"),
    ("ssh-ed25519 AAAA", "does not decode"),
    ("ssh-ed25519 " + HOST_KEY.split()[1] + "AAAA", "does not decode"),
    ("ssh-rsa " + HOST_KEY.split()[1], "declares ssh-rsa but the key inside is 'ssh-ed25519'"),
    ("ssh-ed25519 " + RSA_KEY.split()[1], "declares ssh-ed25519 but the key inside is 'ssh-rsa'"),
    ("ecdsa-sha2-nistp521 " + ECDSA_KEY.split()[1], "declares ecdsa-sha2-nistp521"),
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAEAAAAAAAAAAAAAAAAAAAAAA=", "malformed"),
    ("ssh-ed25519 " + HOST_KEY.split()[1] + "\n", "not an SSH public host key"),
])
def test_malformed_host_keys_are_refused(key, rule):
    errs = errors_of({**BASE, "host": {"address": "10.0.0.11", "hostKey": key}})
    assert rule in errs["gpu-serving:host.hostKey"], errs


def test_every_settings_class_is_found_where_it_says_it_lives():
    """Each model (and the serving settings' base built from the flag table at run time) names the
    module it is bound in, so pickle and pydantic find it there; parsed settings survive a pickle."""
    import pickle
    import sys

    from components.core.config import OPTIONAL_SECTIONS, SECTIONS, StackSettings
    from components.core.config_hosts import HostEntry

    classes = {StackSettings, HostEntry, *SECTIONS.values(), *OPTIONAL_SECTIONS.values()}
    classes |= {base for cls in list(classes) for base in cls.__mro__ if base.__module__.startswith("components.")}
    assert any(c.__name__ == "_ServingFlags" for c in classes)
    for cls in classes:
        assert getattr(sys.modules[cls.__module__], cls.__qualname__) is cls, cls
    settings = parse_settings("t", {**BASE, "serving": {"memFractionStatic": 0.8}})
    assert pickle.loads(pickle.dumps(settings)) == settings
