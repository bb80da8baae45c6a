"""The readiness wait on the host (reads.SNAPSHOT_SCRIPT), run here by /bin/sh with stand-ins for
curl, systemctl, journalctl and sleep on PATH, each logging its call: a server that is still
loading (the port closed, the unit activating) is asked every poll, the wait ends when its window
does, and the loop starts no process of its own to read the clock (it read it with `date` and
`awk` each time: two more processes every 0.2 s, for as long as a server loads)."""
import os
import subprocess
import time
from pathlib import Path

from components.core import reads

STANDINS = {
    # The server is loading: nothing answers on its port; systemd says the unit is activating.
    "curl": 'echo curl >> "$LOG"; printf 000; exit 7\n',
    "systemctl": 'echo systemctl >> "$LOG"\n'
                 'case "$*" in *--value*) echo activating ;; *) printf "ActiveState=activating\\nMainPID=42\\n" ;; esac\n',
    "journalctl": 'echo journalctl >> "$LOG"\n',
    "sleep": 'echo sleep >> "$LOG"; exec /bin/sleep "$@"\n',
    "date": 'echo date >> "$LOG"; exec /bin/date "$@"\n',
    "awk": 'echo awk >> "$LOG"; exec /usr/bin/awk "$@"\n',
}


# The unit leaves `activating` at its fourth look (`systemctl show --value`, the loop's own look):
# the loop then ends by the unit's state, not by its window, after exactly three polls whatever
# the machine's load (a poll that takes longer changes when, not how many).
STOPS_AFTER_THREE_POLLS = {
    **STANDINS,
    "systemctl": 'echo systemctl >> "$LOG"\n'
                 'case "$*" in *--value*) echo look >> "$LOG.looks"\n'
                 '  if [ "$(wc -l < "$LOG.looks")" -le 3 ]; then echo activating; else echo failed; fi ;;\n'
                 '*) printf "ActiveState=failed\\nMainPID=0\\n" ;; esac\n',
}


def run_wait(tmp_path: Path, window: float, standins: dict = STANDINS) -> tuple[float, list[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in standins.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    log = tmp_path / "calls"
    log.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log)}
    # $1 unit, $2 address, $3 port, $4 generation timeout, $5 start ("-": no journal), $6 window,
    # $7 settle, $8 the port as last seen, $9 ready line seen
    args = ["u.service", "127.0.0.1", "30001", "5", "-", str(window), "0", "", "0"]
    started = time.monotonic()
    out = subprocess.run(["/bin/sh", "-c", reads.SNAPSHOT_SCRIPT, "sh", *args], env=env, capture_output=True,
                         text=True, timeout=window + 60)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    return took, log.read_text().split(), out.stdout


def test_a_loading_server_is_asked_every_poll_until_the_window_ends(tmp_path):
    took, calls, stdout = run_wait(tmp_path, 1.0)
    polls = calls.count("sleep")
    # The bound is the promise (the wait lasts its window, no less, then ends): the lower end is
    # exact (load only delays), the upper one has room for a loaded machine.
    assert 1.0 <= took < 1.0 + 20, took
    # One ask of the health and of the unit a poll, then the report's own. Each poll sleeps 0.2 s
    # and a sleep never ends early, so at most 6 start in the 1 s window (exact: load only makes
    # polls longer). How many fit is the machine's business: on a loaded one a single poll can
    # take the whole window, so one is all that is certain. (How many polls, counted whatever the
    # load: the next test, whose unit ends the loop.)
    assert 1 <= polls <= 6, calls
    assert calls.count("curl") == polls + 1 and calls.count("systemctl") == polls + 1, calls
    assert "@@health\n000 7" in stdout and "ActiveState=activating" in stdout


def test_the_wait_reads_the_clock_without_a_process_a_poll(tmp_path):
    # A window far longer than three polls can take: the unit's state ends the loop, after
    # exactly three polls (STOPS_AFTER_THREE_POLLS), so the count below does not depend on load.
    _, calls, _ = run_wait(tmp_path, 300.0, STOPS_AFTER_THREE_POLLS)
    assert calls.count("sleep") == 3, calls  # three polls, yet awk once
    # The window's end is worked out once; each poll then reads /proc/uptime in the shell itself.
    assert calls.count("awk") == 1 and calls.count("date") == 0, calls
