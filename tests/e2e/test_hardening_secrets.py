"""Issue 8, points 2 and 3, for real: secrets stay secret, and the host's identity is pinned.

The stacks of this module are configured as for a real host (README "Pointing a stack at a real
host"): `host.address`, `host.hostKey` pinned, the SSH private key as the secret
`gpu-serving:sshPrivateKey` (set from stdin, as the README says), and an HF token as the secret
`gpu-serving:hfToken`. After a good `up`, previews, a failed `up` (an engine that crashes while
loading), a failed `up` whose server prints the token into its journal as it fails (the
rehearsal engine's `crash_printing_environment`) and a remote command that fails while printing
the token, the test looks for both secrets in everything the engine printed, the file backend (state, backups, history), the
stack's outputs and export, the Pulumi home, the project's files, and on the host: every file the
deployment created or changed (the overlay's upper layer), the tmpfs directories, the whole
journal, and the command lines sshd ran. The only place a secret may be is the 0600 root
environment file, and only the token.
"""
from __future__ import annotations

import json
import secrets as pysecrets
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from components.remote import ssh
from tests import hardening_support as H

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

ENV_FILE = "/etc/gpu-serving/kimi-k2.6.env"
# The stack whose server prints the token into its own journal when it fails to load, and the
# words of that line (the rehearsal engine's crash_printing_environment).
LEAK_UNIT, LEAK_ENV_FILE = "sglang-kimi-k2.6-leak.service", "/etc/gpu-serving/leak/kimi-k2.6.env"
SERVER_LEAK = b"(rehearsal fault crash_printing_environment); environment of the failed process: "
# How the state marks a secret value (the engine's signature key): encrypted in an export, its
# plaintext beside it in an export with --show-secrets.
SECRET_SIG = "4dabf18193072939515e22adb298388d"


class Secrets:
    def __init__(self, d, key: str, token: str):
        self.d, self.key, self.token = d, key, token
        self.outputs: dict[str, str] = {}

    @property
    def patterns(self) -> list[str]:
        """The token, the whole key, and each line of the key's body that holds secret bytes (a
        JSON or escaped copy of the key still contains its lines). The first two lines of an
        OpenSSH key are the format header and the public key, the same in any copy of any key."""
        body = [line for line in self.key.splitlines() if len(line) >= 20 and not line.startswith("-----")]
        assert len(body) >= 4
        return [self.token, self.key.strip(), *body[2:]]

    def hits(self, text: str | bytes) -> list[str]:
        data = text.encode() if isinstance(text, str) else text
        return [p[:12] + "..." for p in self.patterns if p.encode() in data]


def pulumi_cli(d, *args: str, input: str | None = None, stack: str | None = None) -> subprocess.CompletedProcess:
    argv = [str(Path(d.env["GPU_SERVING_PULUMI_BIN"]) / "pulumi"), *args, "--non-interactive"]
    if stack:
        argv += ["--stack", stack]
    return subprocess.run(argv, cwd=d.project, env=d.env, input=input, capture_output=True, text=True, timeout=300)


def set_secret(d, stack: str, key: str, value: str) -> None:
    d.stack(stack)  # create it
    out = pulumi_cli(d, "config", "set", "--secret", key, input=value, stack=stack)
    assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module")
def real(tmp_path_factory, rehearsal_host_factory) -> Secrets:
    host = rehearsal_host_factory()
    H.install_command_log(host)
    d = make_deployment(tmp_path_factory.mktemp("hardening-secrets"), host)

    def as_real_host(config):
        h = config["gpu-serving:host"]["value"]
        h.pop("rehearsal", None)
        h.update(address=host.address, port=host.port, user=host.user, hostKey=host.host_public_key)
    d.edit_project(as_real_host)
    key = Path(host.private_key).read_text()
    token = "hf_" + "".join(c for c in pysecrets.token_urlsafe(40) if c.isalnum())[:34]
    # A strategy whose engine crashes while loading, with its own environment file.
    d.write_fault_stack("crash", "crash_during_load")
    # One whose server prints its environment, the token's value among it, as it fails to load.
    d.write_fault_stack("leak", "crash_printing_environment")
    for stack in ("tp8", "crash", "leak"):
        set_secret(d, stack, "gpu-serving:sshPrivateKey", key)
        set_secret(d, stack, "gpu-serving:hfToken", token)
    return Secrets(d, key, token)


def capture(s: Secrets, name: str, op, *, fails: bool = False, **kwargs):
    lines: list[str] = []
    if fails:
        with pytest.raises(auto.CommandError) as info:
            op(on_output=lines.append, **kwargs)
        s.outputs[name] = "\n".join(lines) + "\n" + str(info.value)
        return s.outputs[name]
    result = op(on_output=lines.append, **kwargs)
    s.outputs[name] = "\n".join(lines) + "\n" + (result.stdout or "") + (result.stderr or "")
    return result


def test_up_preview_and_a_failed_up_with_secrets(real):
    s, d = real, real.d
    result = capture(s, "up tp8", d.stack("tp8").up)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    capture(s, "preview tp8 --diff", d.stack("tp8").preview, diff=True)
    capture(s, "preview tp8 --refresh --expect-no-changes", d.stack("tp8").preview, refresh=True,
            expect_no_changes=True, diff=True)
    H.fault_injected("an engine crash while secrets are deployed")
    text = capture(s, "failed up crash", d.stack("crash").up, fails=True)
    assert "readiness: crashed_during_load" in text and "Rolled back" in text, text[-3000:]
    assert d.sh("systemctl is-active sglang-kimi-k2.6-tp8.service").strip() == "active"
    H.fault_survived("an engine crash while secrets are deployed")
    for stack in ("tp8", "crash"):
        s.outputs[f"stack output {stack}"] = pulumi_cli(d, "stack", "output", "--json", stack=stack).stdout
        exported = pulumi_cli(d, "stack", "export", stack=stack)
        assert exported.returncode == 0, exported.stderr
        s.outputs[f"stack export {stack}"] = exported.stdout
        # The export's secrets are ciphertext; the state says which values are secret.
        assert "4dabf18193072939515e22adb298388d" in exported.stdout


def test_a_failed_remote_command_that_prints_the_token_is_redacted(real):
    s, h = real, real.d.host
    t = ssh.Target(h.address, h.port, h.user, s.key, h.host_public_key, 15, 60)
    with pytest.raises(ssh.RemoteError) as info:
        ssh.run(t, ["sh", "-c", 'cat "$1"; echo "token was $(grep HF_TOKEN "$1")" >&2; exit 3', "sh", ENV_FILE],
                purpose="reading the environment file", timeout=30, secrets=[s.token])
    message = str(info.value)
    s.outputs["failed remote command"] = message
    leaked = s.token in message  # compared apart: a failed `in` would print the message
    assert not leaked and "exit 3" in message and 'token was HF_TOKEN="[secret]"' in message, message


def outside_secrets(value):
    """The state with every secret value taken out (what may hold the token: nothing)."""
    if isinstance(value, dict):
        return None if SECRET_SIG in value else {k: outside_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [outside_secrets(v) for v in value]
    return value


def test_a_server_that_prints_the_token_as_it_fails_to_load_never_gets_it_into_the_up_or_the_state(real):
    """Issue 44.2, end to end through the provider's own path. tp8 serves; the `leak` stack's
    server (the rehearsal engine's crash_printing_environment) fails while loading and writes the
    HF token it was given (gpu-serving:hfToken, in its environment file) into its journal, on the
    last line of its traceback, as real failure reports have; tp8, started again by the rollback,
    fails the same way (a runtime drop-in gives it the fault), so nothing serves and the service
    records the failure in the state (`switchFailure`, the readiness report's `rollback`) as well
    as failing the `up`. The provider's journal tails go through its own redaction (the switch
    executor's, of `ServiceSpec.secrets`: the resource's secretEnvironment), with no secret list
    handed over by this test.

    The token is absent from the whole output of the `up` (every line the engine printed, and the
    error's stdout and stderr), from `pulumi stack export` and `stack output` (secrets stay
    ciphertext), and from the Automation API's export outside the values the state keeps secret
    (`Stack.export_stack` always passes --show-secrets). The state is where a broken redaction
    shows: the engine itself prints a secret config value as `[secret]` (its output filter), while
    `switchFailure`, an output no input made secret, is stored as the provider wrote it. Not blind:
    the server's line is in the output and in the recorded failure with the token's place taken,
    and the token is in both units' journals on the host."""
    s, d = real, real.d
    tp8 = "sglang-kimi-k2.6-tp8.service"
    # What the failed switch rolls back to (an `up` that changes nothing when tp8 already serves).
    assert d.stack("tp8").up().outputs["readiness"].value["status_when_checked"] == "ready"
    drop_in = f"/run/systemd/system/{tp8}.d"
    d.sh(f"mkdir -p {drop_in} && printf '[Service]\\nEnvironment=REHEARSAL_FAULT=crash_printing_environment\\n' "
         f"> {drop_in}/pt-fault.conf && systemctl daemon-reload")
    H.fault_injected("a server that prints the HF token as it fails to load, and a rollback that fails the same way")
    try:
        text = capture(s, "failed up leak", d.stack("leak").up, fails=True)
    finally:
        d.sh(f"rm -rf {drop_in} && systemctl daemon-reload")
    exported = pulumi_cli(d, "stack", "export", stack="leak")
    output = pulumi_cli(d, "stack", "output", "--json", stack="leak").stdout
    s.outputs["stack export leak"], s.outputs["stack output leak"] = exported.stdout, output
    # The token's absence first, so that no message below can print it (nor pytest's own account
    # of a failed `in`: only the names of the places are compared).
    leaked = [name for name, value in (("up", text), ("export", exported.stdout), ("output", output)) if s.token in value]
    assert not leaked, leaked
    assert "readiness: crashed_during_load" in text and "rollback failed: nothing serves on " in text, text[-3000:]
    for unit in (LEAK_UNIT, tp8):
        printed = s.token in d.sh(f"journalctl -u {unit} --no-pager -o cat")
        assert printed, f"{unit} must have printed the token"
    line = "could not load the checkpoint's weights (rehearsal fault crash_printing_environment); environment of the " \
           "failed process: "
    assert line in text and "HF_TOKEN=[secret]" in text, text[-3000:]
    assert exported.returncode == 0 and SECRET_SIG in exported.stdout, exported.stderr
    failure = [r["outputs"]["switchFailure"] for r in json.loads(exported.stdout)["deployment"]["resources"]
               if (r.get("outputs") or {}).get("switchFailure")]
    assert len(failure) == 1 and line in failure[0] and "HF_TOKEN=[secret]" in failure[0], failure
    assert "rollback failed: nothing serves on " in json.loads(output)["readiness"]["rollback"], output
    decrypted = d.stack("leak").export_stack().deployment
    kept = s.token in json.dumps(decrypted)
    assert kept, "the token is in the state as a secret (else this looks at nothing)"
    leaked = s.token in json.dumps(outside_secrets(decrypted))
    assert not leaked, "the token is in the state outside its secret values"
    # tp8 serves again for the tests after this one.
    assert d.stack("tp8").up(refresh=True).outputs["readiness"].value["status_when_checked"] == "ready"
    H.fault_survived("a server that prints the HF token as it fails to load, and a rollback that fails the same way")


def test_environment_file_is_0600_root_and_the_only_place_of_the_token(real):
    s, d = real, real.d
    allowed = {ENV_FILE, "/etc/gpu-serving/crash/kimi-k2.6.env"}
    if d.host.run(f"test -e {LEAK_ENV_FILE}").returncode == 0:  # the leak stack's test ran before
        allowed.add(LEAK_ENV_FILE)
    assert d.sh(f"stat -c '%a %U %G' {' '.join(sorted(allowed))}").split() == ["600", "root", "root"] * len(allowed)
    found: dict[str, list[str]] = {}
    seen: set[str] = set()

    # Every file the deployment created or changed on the host: the overlay's upper layer.
    upper = Path(d.host.instance_dir) / "upper"
    checked = 0
    for path in upper.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        checked += 1
        hits = s.hits(path.read_bytes())
        where = "/" + str(path.relative_to(upper))
        if hits and where in allowed:
            seen.add(where)
            st = path.stat()
            assert hits == [s.token[:12] + "..."], f"{where} holds more than the token"
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0, where
            continue
        if hits and not where.startswith("/var/log/journal/"):  # the journal is checked decoded below
            found[f"host file {where}"] = hits
    assert checked > 20
    assert seen == allowed, "the search must find the token where it belongs (it is not blind)"
    s.outputs["host files"] = ""
    # The journal, decoded (journald compresses large fields), every entry but the lines the
    # servers printed themselves under crash_printing_environment (the token's value among them;
    # what the deployment repeats of them is checked in the outputs above).
    journal = subprocess.run(["journalctl", "-D", str(Path(d.host.instance_dir) / "merged/var/log/journal"), "-o",
                              "json", "--all", "--no-pager"], capture_output=True, timeout=120).stdout
    entries = [json.loads(line) for line in journal.splitlines() if line.strip()]
    assert any(e.get("_SYSTEMD_UNIT") == "sglang-kimi-k2.6-crash.service" for e in entries)
    journal = b"\n".join(field_bytes(v) for e in entries if SERVER_LEAK not in field_bytes(e.get("MESSAGE", ""))
                          for v in e.values())
    if s.hits(journal):
        found["host journal"] = s.hits(journal)
    s.outputs["host journal"] = ""
    # tmpfs directories of the running host (not in the overlay).
    out = d.host.run("grep -rlF -f /dev/stdin /run /tmp /dev/shm 2>/dev/null; true", input="\n".join(s.patterns[:2]) + "\n")
    tmpfs = [p for p in out.stdout.split() if p]
    if tmpfs:
        found["host tmpfs"] = tmpfs
    s.outputs["host tmpfs"] = ""
    # Command lines sshd ran for the deployment.
    for command in H.HostRecord(d.host).commands():
        if s.hits(command):
            found.setdefault("host command lines", []).append(command[:80])
    s.outputs["host command lines"] = ""

    # The engine's output, the stack outputs and exports, the error messages.
    for name, text in s.outputs.items():
        if text and s.hits(text):
            found[name] = s.hits(text)
    # The file backend (state, backups, history), the Pulumi home, the project's files.
    root = d.project.parent
    for directory in (root / "state", root / "pulumi-home", d.project):
        for path in directory.rglob("*"):
            if path.is_file() and not path.is_symlink() and ".venv" not in path.parts:
                s.outputs[f"file {path.relative_to(root)}"] = ""
                if s.hits(path.read_bytes()):
                    found[f"file {path.relative_to(root)}"] = s.hits(path.read_bytes())
    H.secrets_checked(len(s.outputs), sum(len(v) for v in found.values()))
    assert not found, json.dumps(found, indent=1)
    assert len([k for k in s.outputs if k.startswith("file state")]) >= 2


def field_bytes(value) -> bytes:
    """A journal field as `journalctl -o json` gives it: text, bytes as a list of numbers, or a
    list of either when the entry has the field more than once."""
    if isinstance(value, list):
        if all(isinstance(x, int) for x in value):
            return bytes(value)
        return b"\n".join(field_bytes(x) for x in value)
    return str(value).encode()


def ssh_keygen_pub(tmp: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "other"), "-C", "impostor"], check=True)
    kind, b64 = (tmp / "other.pub").read_text().split()[:2]
    return f"{kind} {b64}"


def fingerprint(public_key: str, tmp: Path) -> str:
    (tmp / "fp.pub").write_text(public_key + "\n")
    return subprocess.run(["ssh-keygen", "-lf", str(tmp / "fp.pub")], capture_output=True, text=True, check=True).stdout.split()[1]


def test_host_presenting_another_key_is_refused_and_nothing_runs(real, tmp_path):
    """host.hostKey pins another key than the one the host presents (as if another machine
    answered at that address). A new stack: preview does not connect; up stops at the SSH
    handshake with "host identity check failed" and both fingerprints, and the host saw no login
    and no command. The deployed tp8 with the wrong key: up stops the same way, nothing changes
    (its refresh reads still use the key recorded at the last good up)."""
    d = real.d
    other = ssh_keygen_pub(tmp_path)
    host = yaml.safe_load((d.project / "Pulumi.yaml").read_text())["config"]["gpu-serving:host"]["value"]
    wrong = {**host, "hostKey": other}
    d.write_stack_file("impostor", {"tpSize": 8}, {"gpu-serving:host": wrong})
    set_secret(d, "impostor", "gpu-serving:sshPrivateKey", real.key)
    state = f"sha256sum /etc/systemd/system/sglang-* {ENV_FILE}; systemctl show -p MainPID sglang-kimi-k2.6-tp8.service"
    before = d.sh(state)
    H.fault_injected("a host presenting another host key")

    def refused(op) -> str:
        lines: list[str] = []
        with pytest.raises(auto.CommandError) as info:
            op(on_output=lines.append)
        text = "\n".join(lines) + str(info.value)
        assert "host identity check failed" in text, text[-3000:]
        assert fingerprint(other, tmp_path) in text and fingerprint(d.host.host_public_key, tmp_path) in text
        return text

    record = H.HostRecord(d.host)
    mark = record.mark()
    try:
        d.stack("impostor").preview()
        refused(d.stack("impostor").up)
        commands, logins = record.since(mark)
        assert commands == [] and logins == 0, (commands, logins)

        path = d.project / "Pulumi.tp8.yaml"
        original = path.read_text()
        doc = yaml.safe_load(original)  # keeps encryptionsalt and the encrypted secrets
        doc["config"]["gpu-serving:host"] = wrong
        path.write_text(yaml.safe_dump(doc))
        try:
            refused(d.stack("tp8").up)
        finally:
            path.write_text(original)
    finally:
        (d.project / "Pulumi.impostor.yaml").unlink()
    assert d.sh(state) == before
    H.fault_survived("a host presenting another host key")
