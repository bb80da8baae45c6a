"""scripts/env.sh in a clean shell, as the README uses it: `python` and `pulumi` are the project's."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def clean_shell(script: str) -> str:
    out = subprocess.run(["env", "-i", "HOME=/root", "PATH=/usr/bin:/bin", "bash", "--noprofile", "--norc", "-c", script],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_python_is_the_venv_and_path_entries_are_not_repeated():
    out = clean_shell("source scripts/env.sh 2>/dev/null; source scripts/env.sh 2>/dev/null; "
                      'echo "$PATH"; command -v python; command -v pulumi || echo none')
    path, python, pulumi = out.splitlines()
    entries = path.split(":")
    assert python == str(ROOT / ".venv" / "bin" / "python")
    assert entries.count(str(ROOT / ".venv" / "bin")) == 1
    assert len(entries) == len(set(entries)), entries
    assert entries[0].endswith("/bin") and (pulumi == "none" or pulumi == entries[0] + "/pulumi")
    assert entries[-2:] == ["/usr/bin", "/bin"]  # what was there stays, after ours


def test_readme_plan_commands_run_after_sourcing():
    out = clean_shell("source scripts/env.sh 2>/dev/null; python -m components plan --stack ep8 --against tp8 --json")
    assert '"starts": "sglang-kimi-k2.6-ep8.service"' in out


def test_the_file_backend_stays_the_default_and_a_team_url_is_kept():
    out = clean_shell('source scripts/env.sh 2>/dev/null; echo "$PULUMI_BACKEND_URL"; '
                      'PULUMI_BACKEND_URL="postgres://ops@db.example:5432/pulumi_state?sslmode=verify-full"; '
                      'source scripts/env.sh 2>/dev/null; echo "$PULUMI_BACKEND_URL"')
    assert out.splitlines() == [f"file://{ROOT}/.pulumi-state", "postgres://ops@db.example:5432/pulumi_state?sslmode=verify-full"]


def test_a_password_in_a_postgres_url_is_refused_without_printing_it():
    out = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "PULUMI_BACKEND_URL=postgres://ops:hunter2-secret@db:5432/state",
                          "bash", "--noprofile", "--norc", "-c", "source scripts/env.sh && echo sourced"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "sourced" not in out.stdout
    assert "PULUMI_BACKEND_URL holds a password" in out.stderr and "PGPASSWORD" in out.stderr
    assert "hunter2-secret" not in out.stdout + out.stderr
