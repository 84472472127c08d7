#!/usr/bin/env bash
# Builds Tollgate's OCI image offline with buildah, from `scratch`: the binary (etcd support
# included), exactly the shared libraries it loads, the name-service libraries and files DNS
# needs, the CA certificates, and a user of its own (65532), with the data volume at
# /var/lib/tollgate. No base image is pulled; no network is used during the build.
#
#   scripts/image.sh                      # builds the release binary, then the image
#   TOLLGATE_BIN=path scripts/image.sh    # packs that binary instead of building one
#   TOLLGATE_IMAGE=name scripts/image.sh  # the image's name (default localhost/tollgate)
#
# Prints the image's reference (NAME:VERSION, the version `tollgate --version` prints) on its
# last line, after the image's size in bytes and MB (10^6 bytes). Needs buildah (Debian's
# `buildah`), ldd and the CA certificates (/etc/ssl/certs/ca-certificates.crt, Debian's
# `ca-certificates`).
set -euo pipefail
cd "$(dirname "$0")/.."

name=${TOLLGATE_IMAGE:-localhost/tollgate}
bin=${TOLLGATE_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --locked -p tollgate-cli --features etcd >&2
  bin=target/release/tollgate
fi
for tool in buildah ldd; do
  command -v "$tool" >/dev/null 2>&1 || { echo "image.sh: $tool is needed (Debian's package of that name)" >&2; exit 1; }
done
certs=/etc/ssl/certs/ca-certificates.crt
[ -f "$certs" ] || { echo "image.sh: $certs is missing (Debian's ca-certificates)" >&2; exit 1; }
version=$("$bin" --version | awk '{print $2}')
[ -n "$version" ] || { echo "image.sh: $bin --version printed no version" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/etc/tollgate/tls" "$root/var/lib"
install -d -m 0700 "$stage/data"
install -d -m 1777 "$root/tmp"
install -m 0755 "$bin" "$root/usr/local/bin/tollgate"

# The loader and every library the binary links, at the paths ldd resolves them to; then the
# name-service modules glibc loads at run time (not linked, so ldd does not list them).
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
multiarch=$(dirname "$(ldd "$bin" | awk '$1 == "libc.so.6" {print $3}')")
for extra in libnss_files.so.2 libnss_dns.so.2 libresolv.so.2; do
  [ -e "$multiarch/$extra" ] && libs="$libs $multiarch/$extra"
done
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
install -m 0644 "$certs" "$root/etc/ssl/certs/ca-certificates.crt"
cat >"$root/etc/nsswitch.conf" <<'EOF'
passwd: files
group:  files
hosts:  files dns
EOF
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
tollgate:x:65532:65532:tollgate:/var/lib/tollgate:/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
tollgate:x:65532:
EOF
# The server listens beyond loopback only with TLS and --auth: the image's command asks for
# both, the certificate and key mounted at /etc/tollgate/tls (a Kubernetes TLS secret's names).
cat >"$stage/Containerfile" <<EOF
FROM scratch
COPY rootfs/ /
COPY --chown=65532:65532 data/ /var/lib/tollgate/
USER 65532:65532
WORKDIR /var/lib/tollgate
VOLUME /var/lib/tollgate
EXPOSE 7460/tcp 7461/tcp
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LABEL org.opencontainers.image.title="tollgate" \\
      org.opencontainers.image.version="$version" \\
      org.opencontainers.image.licenses="Apache-2.0" \\
      org.opencontainers.image.description="Global admission control for shared, multi-tenant systems"
ENTRYPOINT ["/usr/local/bin/tollgate", "server"]
CMD ["--data", "/var/lib/tollgate", "--grpc", "0.0.0.0:7460", "--http", "0.0.0.0:7461", "--auth", "--tls-cert", "/etc/tollgate/tls/tls.crt", "--tls-key", "/etc/tollgate/tls/tls.key"]
EOF
# Dated by the last commit (when there is one), so the same source builds the same image.
stamp=$(git log -1 --format=%ct 2>/dev/null || echo 0)
buildah bud --quiet --network=none --layers=false --timestamp "$stamp" -t "$name:$version" -f "$stage/Containerfile" "$stage" >&2
# What the image weighs: its layers, uncompressed, as its manifest lists them.
bytes=$(buildah inspect --type image --format '{{.Manifest}}' "$name:$version" | sed 's/.*"layers"://' \
  | grep -o '"size":[0-9]*' | awk -F: '{ s += $2 } END { print s }')
echo "image size: $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }') MB)"
echo "$name:$version"
