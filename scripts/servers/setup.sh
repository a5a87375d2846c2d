#!/usr/bin/env bash
# Put the real servers the `cluster` tests meet on this machine: PostgreSQL (Debian's package)
# for MLflow's production backend store, and MinIO built from source (install_minio.sh).
#
# Idempotent and fast once done (two checks, no network). Run by `make servers`, which
# `make test` depends on. Without root, a missing PostgreSQL is reported, not installed.
#
# Usage: scripts/servers/setup.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

pg_bindir() {
  # Debian keeps the server binaries off PATH, one folder per major version; take the newest.
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

dir="$(pg_bindir)"
if [[ -z "$dir" || ! -x "$dir/initdb" ]]; then
  if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "servers: installing PostgreSQL (apt-get)" >&2
    start=$(date +%s)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The package's post-install creates and starts a cluster on 5432; the tests never use it
    # (they initdb their own on a free port), so stop it to leave the port and memory free.
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    if command -v pg_ctlcluster >/dev/null 2>&1; then
      pg_lsclusters -h 2>/dev/null | while read -r ver name _; do
        pg_ctlcluster "$ver" "$name" stop 2>/dev/null || true
      done
    fi
    echo "servers: PostgreSQL installed in $(( $(date +%s) - start )) s" >&2
  else
    echo "servers: PostgreSQL is missing and this is not a root shell with apt-get." >&2
    echo "fix: run 'sudo apt-get install postgresql' (the MLflow-on-PostgreSQL tests need it)." >&2
  fi
else
  echo "servers: PostgreSQL present ($dir)" >&2
fi

minio="$("$here/install_minio.sh")"
echo "servers: MinIO ready ($minio)" >&2
