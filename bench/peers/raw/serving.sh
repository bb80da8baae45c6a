#!/usr/bin/env bash
# The serving strategy as a plain shell script of ssh commands: the cheapest way to do the same
# work, the benchmarks' baseline. Per host ONE ssh connection runs one remote script that carries
# the files (base64), writes only what differs (atomically, the environment file 0600), reloads
# systemd only when the unit changed, enables and (re)starts the unit, and waits until the
# server generates. The hosts run in parallel.
#
#   serving.sh converge|check HOSTS_FILE UNIT_NAME UNIT_TEXT_FILE ENV_PATH ENV_TEXT_FILE PORT [SIBLING...]
#
# SIBLING: the other deployed strategies' units, disabled (only the serving one is enabled).
# HOSTS_FILE: one host a line, "user@address private_key known_hosts".
# check: sha256 of both files + their modes, systemctl is-active/is-enabled, /health_generate;
# prints "DRIFT host: what" lines and exits 1 when anything differs.
set -euo pipefail
[ $# -ge 7 ] || { echo "usage: $0 converge|check HOSTS UNIT UNIT_TEXT ENV_PATH ENV_TEXT PORT [SIBLING...]" >&2; exit 2; }
mode=$1 hosts=$2 unit=$3 unit_src=$4 env_path=$5 env_src=$6 port=$7
shift 7
siblings="$*"
unit_path=/etc/systemd/system/$unit
unit_sha=$(sha256sum <"$unit_src" | cut -c1-64)
env_sha=$(sha256sum <"$env_src" | cut -c1-64)
url="http://127.0.0.1:$port/health_generate"

converge_script() {
  cat <<SCRIPT
set -eu
put() {  # path mode sha256 base64: write only when content or mode differ
  if [ "\$(sha256sum "\$1" 2>/dev/null | cut -c1-64)" = "\$3" ] && [ "\$(stat -c %a "\$1")" = "\$2" ]; then return 1; fi
  mkdir -p "\$(dirname "\$1")"
  tmp="\$1.raw-\$\$"
  (umask 077; printf '%s' "\$4" | base64 -d >"\$tmp")
  chmod "\$2" "\$tmp" && mv -f "\$tmp" "\$1"
}
changed=0 unit_changed=0
put '$env_path' 600 $env_sha '$(base64 -w0 <"$env_src")' && changed=1
put '$unit_path' 644 $unit_sha '$(base64 -w0 <"$unit_src")' && changed=1 unit_changed=1
[ \$unit_changed = 0 ] || systemctl daemon-reload
systemctl is-enabled --quiet '$unit' || systemctl enable --quiet '$unit'
if [ \$changed = 1 ]; then systemctl restart '$unit'; else systemctl start '$unit'; fi
for s in $siblings; do if systemctl is-enabled --quiet "\$s"; then systemctl disable --quiet "\$s"; fi; done
i=0
until [ "\$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 '$url')" = 200 ]; do
  i=\$((i + 1)); [ \$i -lt 7200 ] || { echo "$unit: not generating after an hour" >&2; exit 1; }
  ! systemctl is-failed --quiet '$unit' || { echo "$unit failed" >&2; exit 1; }
  sleep 0.5
done
SCRIPT
}

check_script() {
  cat <<SCRIPT
d=0
[ "\$(sha256sum '$env_path' 2>/dev/null | cut -c1-64)" = $env_sha ] || { echo "DRIFT \$(hostname): $env_path content"; d=1; }
[ "\$(stat -c %a '$env_path' 2>/dev/null)" = 600 ] || { echo "DRIFT \$(hostname): $env_path mode"; d=1; }
[ "\$(sha256sum '$unit_path' 2>/dev/null | cut -c1-64)" = $unit_sha ] || { echo "DRIFT \$(hostname): $unit_path content"; d=1; }
[ "\$(systemctl is-active '$unit')" = active ] || { echo "DRIFT \$(hostname): $unit not active"; d=1; }
[ "\$(systemctl is-enabled '$unit')" = enabled ] || { echo "DRIFT \$(hostname): $unit not enabled"; d=1; }
for s in $siblings; do
  [ "\$(systemctl is-enabled "\$s" 2>/dev/null)" != enabled ] || { echo "DRIFT \$(hostname): \$s enabled"; d=1; }
done
code=\$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 '$url')
[ "\$code" = 200 ] || { echo "DRIFT \$(hostname): $url answers \$code"; d=1; }
exit \$d
SCRIPT
}

case $mode in
  converge) script=$(converge_script) ;;
  check) script=$(check_script) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac

pids=()
while read -r target key known; do
  [ -n "$target" ] || continue
  ssh -F /dev/null -i "$key" -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes \
      -o UserKnownHostsFile="$known" -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=10 \
      -o LogLevel=ERROR "$target" sh -s <<<"$script" &
  pids+=($!)
done <"$hosts"
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc
