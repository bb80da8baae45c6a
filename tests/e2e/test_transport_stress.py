"""The SSH transport under the read pattern of a refresh, against a real sshd (a rehearsal host).

Found chasing a CI failure: on a fresh connection, the host-facts read with the later resources'
reads prefetched beside it (many short commands at once on one connection) sometimes lost the
connection: paramiko sent a short command's EOF after the server had closed its channel, OpenSSH
dropped the whole connection ("ieof packet referred to nonexistent channel" in its journal), and
the cut-short answer was taken for a host with 0 GPUs. This repeats that pattern, bounded in
count and time, and requires zero wrong answers: every answer equals the one a quiet,
one-at-a-time read gives, or the read fails; never a truncated answer. It counts what happened
on the way: connections dropped by sshd (its journal) and commands run again (ssh.counters).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from components.core import facts as F
from components.core import reads
from components.remote import ssh
from tests import hardening_support as H

pytestmark = pytest.mark.rehearsal

# Bounds: the whole test stays under about a minute on a busy 2-core machine.
ROUNDS = 40          # fresh connections, each with the host-facts read and its prefetched reads
BURST = 24           # short commands at once on one connection, per round
TIME_BUDGET = 40.0   # seconds of rounds at most (fewer rounds when the machine is slow)
MIN_ROUNDS = 8       # ... but at least these, or the test proves nothing


def later_reads(h) -> list[dict]:
    """What the host-facts resource prefetches on a refresh: the later resources' reads."""
    return (reads.cuda_toolkit({"home": "/usr/local/cuda-13.0", "aptPackage": "cuda-toolkit-13-0"})
            + reads.python_venv({"path": "/root/venv_sglang211"})
            + reads.service({"unit": "sglang-kimi-k2.6-ep8.service"})
            + reads.readiness({"unit": "sglang-kimi-k2.6-ep8.service", "bind": "127.0.0.1", "port": 30001})
            + reads.remote_file({"path": "/etc/os-release"}))


def answer(result):
    return (result.rc, result.stdout, result.stderr) if isinstance(result, ssh.Result) else result


def ieof_drops(h, since: str) -> int:
    out = H.nsenter(h, "journalctl", "-u", "ssh.service", "--since", since, "-o", "cat", "--no-pager", "-q")
    return out.stdout.count("ieof packet referred to nonexistent channel")


def test_many_short_commands_and_prefetched_reads_never_give_a_wrong_answer(rehearsal_host):
    h = rehearsal_host
    t = ssh.Target(h.address, h.port, h.user, Path(h.private_key).read_text(), h.host_public_key, 10, 60)
    since = H.nsenter(h, "date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    facts_request, = reads.host_facts({"cudaHome": "/usr/local/cuda-13.0"})
    later = later_reads(h)

    # The truth: each read alone, one after the other, on a quiet connection.
    ssh.drop(t)
    truth_facts = F.parse_facts(ssh.fetch(t, facts_request).stdout)
    assert len(truth_facts.gpus) == 8 and not truth_facts.problems, truth_facts
    truth = [answer(ssh.fetch(t, r)) for r in later]

    before = dict(ssh.counters)
    served_before = ssh.prefetched.stats["served"]
    wrong: list[str] = []
    rounds = commands = 0
    start = time.monotonic()
    with ThreadPoolExecutor(BURST) as pool:
        while rounds < ROUNDS and (time.monotonic() - start < TIME_BUDGET or rounds < MIN_ROUNDS):
            rounds += 1
            ssh.drop(t)  # a fresh connection, as each `pulumi` run opens one
            ssh.client(t)
            ssh.prefetch(t, later)
            got = F.parse_facts(ssh.fetch_first(t, facts_request).stdout)  # raises when cut short
            if got != truth_facts:
                wrong.append(f"round {rounds}: host facts {got}")
            for r, want in zip(later, truth):
                seen = answer(ssh.fetch(t, r))
                if seen != want:
                    wrong.append(f"round {rounds}: {r.get('purpose') or r['op']} answered {seen!r}, alone {want!r}")
            # Many short commands at once on the same connection.
            outs = list(pool.map(lambda n: ssh.run(t, ["echo", str(n)], purpose=f"echo {n}", timeout=30, read=True),
                                 range(BURST)))
            commands += len(later) + 1 + BURST
            wrong += [f"round {rounds}: echo {n} answered {o!r}" for n, o in enumerate(outs)
                      if (o.rc, o.stdout) != (0, f"{n}\n")]
    seconds = time.monotonic() - start
    ssh.drop(t)
    lost = ssh.counters["lost"] - before["lost"]
    retried = ssh.counters["retried"] - before["retried"]
    drops = ieof_drops(h, since)
    print(f"transport stress: {rounds} connections, {commands} commands in {seconds:.1f} s; "
          f"{ssh.prefetched.stats['served'] - served_before} prefetched answers served; "
          f"sshd dropped {drops} connection(s) for a late EOF; {lost} command(s) lost their connection, "
          f"{retried} run again; {len(wrong)} wrong answer(s)")
    assert rounds >= MIN_ROUNDS
    assert wrong == [], "\n".join(wrong[:20])
    # The race itself is gone: no half-close is ever sent for a command without input.
    assert drops == 0
