#!/usr/bin/env bash
# Build the real MinIO server from source through the Go module proxy, once, and print its path.
#
# The binary is cached outside the repository in a folder named after the module version
# (~/.cache/fedtune/minio/<version>/minio, or $FEDTUNE_SERVERS_CACHE/minio/<version>/minio), so
# a second run costs nothing and a version bump builds beside the old one. Nothing built here
# is committed. The tests in tests/charts/test_chart_minio.py start this binary.
#
# Pinned: `@latest` of github.com/minio/minio is a pseudo-version of its default branch (MinIO
# publishes no semver tags, and the proxy refuses the RELEASE.* tag names), so a fresh machine
# would otherwise build whatever the branch holds that day. Bump on purpose.
#
# Usage: scripts/servers/install_minio.sh [--print-version]
set -euo pipefail

MINIO_MODULE="github.com/minio/minio"
MINIO_VERSION="${FEDTUNE_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
CACHE_ROOT="${FEDTUNE_SERVERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fedtune}"
DEST="$CACHE_ROOT/minio/$MINIO_VERSION"
BIN="$DEST/minio"

if [[ "${1:-}" == "--print-version" ]]; then
  echo "$MINIO_VERSION"
  exit 0
fi

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
  echo "$BIN"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "install_minio: no 'go' on PATH; MinIO is built from source with Go >= 1.24." >&2
  echo "fix: install Go (the polyglot machines ship Go 1.26) and rerun this script." >&2
  exit 3
fi

mkdir -p "$DEST"
echo "install_minio: building $MINIO_MODULE@$MINIO_VERSION into $DEST (minutes, once)" >&2
start=$(date +%s)
# -mod=mod: resolve MinIO's own go.mod through the proxy. A failed build leaves no
# half-written binary behind.
if ! GOBIN="$DEST.tmp" GOFLAGS="-mod=mod -buildvcs=false" \
    go install "$MINIO_MODULE@$MINIO_VERSION" >&2; then
  rm -rf "$DEST.tmp"
  echo "install_minio: 'go install $MINIO_MODULE@$MINIO_VERSION' failed (output above)." >&2
  echo "fix: check that the Go module proxy (\$GOPROXY, now $(go env GOPROXY)) is reachable." >&2
  exit 4
fi
mv "$DEST.tmp/minio" "$BIN"
rm -rf "$DEST.tmp"
echo "install_minio: built in $(( $(date +%s) - start )) s, $(du -h "$BIN" | cut -f1)" >&2
echo "$BIN"
