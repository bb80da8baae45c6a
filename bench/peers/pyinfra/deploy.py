"""The serving strategy the way pyinfra's docs recommend: files.template / files.put and
systemd.service, with pyinfra's retries for the wait. Host data (from the inventory the runner
writes, out of `python -m components plan --stack S --json`): unit_name, unit_text,
environment_path, environment_text, port, siblings (the other deployed strategies' units); drift_check=True (--data) makes the wait a read.
"""
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

HERE = Path(__file__).resolve().parent
d = host.data
health_url = f"http://127.0.0.1:{d.port}/health_generate"

environment_file = files.put(
    name="Shared environment file (0600)",
    src=StringIO(d.environment_text),
    dest=d.environment_path,
    user="root",
    group="root",
    mode="600",
)
unit_file = files.template(
    name="Strategy unit",
    src=str(HERE / "templates" / "unit.j2"),
    dest=f"/etc/systemd/system/{d.unit_name}",
    user="root",
    group="root",
    mode="644",
    unit_text=d.unit_text,
)
systemd.daemon_reload(name="Reload systemd", _if=unit_file.did_change)
systemd.service(
    name="Unit enabled and running (Conflicts= stops the sibling)",
    service=d.unit_name,
    running=True,
    enabled=True,
)
systemd.service(
    name="Restart the unit (a file changed)",
    service=d.unit_name,
    running=True,
    restarted=True,
    _if=any_changed(environment_file, unit_file),
)
for sibling in d.siblings:
    systemd.service(
        name=f"Only the serving strategy enabled: {sibling} disabled",
        service=sibling,
        running=None,
        enabled=False,
    )

if str(d.get("drift_check", "")).lower() in ("1", "true", "yes"):
    # --dry executes nothing: read the health as a fact instead.
    code = host.get_fact(Command, f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 60 {health_url} || true")
    if code.strip() != "200":
        raise SystemExit(f"DRIFT {host.name}: {health_url} answers {code.strip() or 'nothing'}")
else:
    server.shell(
        name="Wait until the server generates",
        commands=[f"curl -fsS -o /dev/null --max-time 60 {health_url}"],
        _retries=240,
        _retry_delay=0.5,
    )
