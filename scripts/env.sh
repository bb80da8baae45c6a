# scripts/env.sh — THE environment for running the Pulumi engine offline. Source it (bash):
#     source scripts/env.sh
# Used by the scripts, the tests (tests/pulumi_env.py sources this very file) and the README.
# Build the engine first: scripts/bootstrap-pulumi (scripts/setup runs it).
#
# What it sets (variables marked "default" keep a value you set before sourcing):
#   PATH                         the cached engine bin dir first (pulumi, the Python language host,
#                                the dynamic-provider launcher, pulumi-resource-command). The CLI
#                                takes language hosts and resource providers from PATH before its
#                                plugin cache, so nothing is ever installed into PULUMI_HOME.
#                                Then the project's .venv/bin, so `python -m components ...` and
#                                `python -m rehearsal ...` run the project's Python. Both once,
#                                however often the file is sourced.
#   GPU_SERVING_PULUMI_BIN       that bin dir; GPU_SERVING_PULUMI_ROOT its parent, which is what the
#                                Automation API wants: PulumiCommand(root=$GPU_SERVING_PULUMI_ROOT)
#   PULUMI_SKIP_UPDATE_CHECK=true, PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
#                                no network: a missing plugin fails at once, naming the plugin,
#                                instead of hanging on a download
#   PULUMI_RUN_PROGRAM=true      default: refresh runs the program first, so a bad setting is
#                                refused before any read reaches the host
#   PULUMI_BACKEND_URL           default file://<repo>/.pulumi-state (git-ignored; created). A team
#                                sets postgres://USER@HOST:PORT/DATABASE?sslmode=... before sourcing
#                                (docs/teams-and-watch.md); its password comes from PGPASSWORD or PGPASSFILE,
#                                never the URL: a URL holding one is refused here (return 1), since
#                                `pulumi whoami -v` and scripts print the URL as it is.
#   PULUMI_CONFIG_PASSPHRASE     default "gpu-serving-local", only when neither it nor
#                                PULUMI_CONFIG_PASSPHRASE_FILE is set. It encrypts the secrets in
#                                Pulumi.<stack>.yaml and in the state: fine for the rehearsal host;
#                                for a real host set your own passphrase before sourcing.
#   PULUMI_HOME                  default ${GPU_SERVING_CACHE:-/var/cache/gpu-serving}/pulumi-home
#                                (tests set their own per run)
# Versions: scripts/versions.env. Cache root: ${GPU_SERVING_CACHE:-/var/cache/gpu-serving}.

# postgres://user:password@... : refused before anything runs with it (see the header).
if [[ ${PULUMI_BACKEND_URL:-} =~ ^postgres(ql)?://[^/@]*:[^/@]*@ ]]; then
  echo "scripts/env.sh: PULUMI_BACKEND_URL holds a password (postgres://USER:PASSWORD@...): the URL is printed" \
       "by pulumi (whoami -v) and ends up in shell history. Put the password in PGPASSWORD or a passfile" \
       "(PGPASSFILE, ~/.pgpass) and set PULUMI_BACKEND_URL=postgres://USER@HOST:PORT/DATABASE?sslmode=verify-full" >&2
  return 1 2>/dev/null || exit 1
fi

_gs_repo=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
# shellcheck source=versions.env
. "$_gs_repo/scripts/versions.env"
_gs_cache=${GPU_SERVING_CACHE:-/var/cache/gpu-serving}

export GPU_SERVING_PULUMI_ROOT="$_gs_cache/pulumi/v$PULUMI_VERSION"
export GPU_SERVING_PULUMI_BIN="$GPU_SERVING_PULUMI_ROOT/bin"
export PULUMI_VERSION PULUMI_PYTHON_SDK_VERSION PULUMI_COMMAND_VERSION

# Engine bin dir first on PATH, then the project's venv, each exactly once.
_gs_venv_bin="$_gs_repo/.venv/bin"
_gs_path=":${PATH:-}:"
while [[ $_gs_path == *":$GPU_SERVING_PULUMI_BIN:"* || $_gs_path == *":$_gs_venv_bin:"* ]]; do
  _gs_path=${_gs_path//":$GPU_SERVING_PULUMI_BIN:"/:}
  _gs_path=${_gs_path//":$_gs_venv_bin:"/:}
done
_gs_path=${_gs_path#:}
_gs_path=${_gs_path%:}
export PATH="$GPU_SERVING_PULUMI_BIN:$_gs_venv_bin${_gs_path:+:$_gs_path}"

export PULUMI_SKIP_UPDATE_CHECK=true
# With `refresh: always`, run the program before refreshing: a bad setting is refused before any
# command reaches the host, even for a stack that is already deployed.
export PULUMI_RUN_PROGRAM=${PULUMI_RUN_PROGRAM:-true}
export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true

if [ -z "${PULUMI_BACKEND_URL:-}" ]; then
  mkdir -p "$_gs_repo/.pulumi-state"
  export PULUMI_BACKEND_URL="file://$_gs_repo/.pulumi-state"
fi

if [ -z "${PULUMI_CONFIG_PASSPHRASE+x}" ] && [ -z "${PULUMI_CONFIG_PASSPHRASE_FILE:-}" ]; then
  export PULUMI_CONFIG_PASSPHRASE=gpu-serving-local
fi

if [ -z "${PULUMI_HOME:-}" ]; then
  export PULUMI_HOME="$_gs_cache/pulumi-home"
fi
mkdir -p "$PULUMI_HOME" 2>/dev/null || true

if [ ! -x "$GPU_SERVING_PULUMI_BIN/pulumi" ]; then
  echo "scripts/env.sh: no Pulumi engine at $GPU_SERVING_PULUMI_BIN yet: run scripts/bootstrap-pulumi" >&2
fi

unset _gs_repo _gs_cache _gs_path _gs_venv_bin
