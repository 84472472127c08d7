#!/usr/bin/env bash
# Builds the release archive tollgate-VERSION-x86_64-linux.tar.gz, and its SHA-256 sum beside
# it, in dist/: the binary (etcd support included), LICENSE, README.md, CHANGELOG.md, docs/ (the
# guides README.md links to) and deploy/ (the systemd unit, the Kubernetes manifests, the
# Prometheus rules, the Grafana board), under one directory named like the archive.
#
#   scripts/release.sh                     # builds the release binary, then the archive
#   TOLLGATE_BIN=path scripts/release.sh   # packs that binary instead of building one
#   TOLLGATE_DIST=dir scripts/release.sh   # writes to dir (default dist/)
#
# Prints the archive's path on its last line, after the oldest glibc the binary runs on (the
# newest symbol version it asks of glibc) and the sizes of the binary and the archive, in bytes
# and MB (10^6 bytes).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${TOLLGATE_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --locked -p tollgate-cli --features etcd >&2
  bin=target/release/tollgate
fi
dist=${TOLLGATE_DIST:-dist}
version=$("$bin" --version | awk '{print $2}')
[ -n "$version" ] || { echo "release.sh: $bin --version printed no version" >&2; exit 1; }
grep -q -- '--etcd' <<<"$("$bin" server --help)" || { echo "release.sh: $bin was built without etcd support (--features etcd)" >&2; exit 1; }
name=tollgate-$version-x86_64-linux
glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name"
install -m 0755 "$bin" "$stage/$name/tollgate"
install -m 0644 LICENSE README.md CHANGELOG.md "$stage/$name/"
cp -R docs "$stage/$name/docs"
cp -R deploy "$stage/$name/deploy"
mkdir -p "$dist"
# Dated by the last commit and owned by no one in particular, so the same source packs the
# same bytes.
stamp=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar --sort=name --mtime="@$stamp" --owner=0 --group=0 --numeric-owner -C "$stage" -cf - "$name" \
  | gzip -n >"$dist/$name.tar.gz"
(cd "$dist" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "oldest glibc: ${glibc#GLIBC_}"
size() { local bytes; bytes=$(stat -c %s "$1"); echo "$bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }') MB)"; }
echo "binary size: $(size "$bin")"
echo "archive size: $(size "$dist/$name.tar.gz")"
echo "$dist/$name.tar.gz"
