#!/usr/bin/env bash
# Set up what the TypeScript and Rust operator runtimes build and test with, when it is missing
# and we may: Debian's librust-serde-json-dev, librust-ureq-dev and librust-serde-derive-dev (the
# Rust crate's offline directory source, /usr/share/cargo/registry) and cargo itself (root with
# apt-get), then the TypeScript package's dev dependencies (`npm ci`: typescript, and quicktype-core,
# which generates the runtimes' Task and Envelope types). Prints what it did; exits 0
# when node >= 20, npm, cargo and the librust packages are all present afterwards, 1 otherwise
# (the runtime tests then skip, except in CI where they fail).
set -uo pipefail
cd "$(dirname "$0")/.."
REGISTRY=/usr/share/cargo/registry
PACKAGES=(librust-serde-json-dev librust-ureq-dev librust-serde-derive-dev)
have_cargo() { command -v cargo >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/cargo" ]; }
have_crates() { [ -d "$REGISTRY/ureq-2.6.2" ] && [ -d "$REGISTRY/serde_json-1.0.87" ] && [ -d "$REGISTRY/serde_derive-1.0.152" ]; }
missing=()
if ! have_crates || ! have_cargo; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    wanted=("${PACKAGES[@]}")
    have_cargo || wanted+=(cargo)
    echo "install_runtime_deps: apt-get install ${wanted[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq "${wanted[@]}" >/dev/null
  else
    echo "install_runtime_deps: the Rust runtime needs cargo and, as root on Debian:" >&2
    echo "  sudo apt-get install -y ${PACKAGES[*]}" >&2
  fi
fi
have_cargo || missing+=(cargo)
have_crates || missing+=("${PACKAGES[@]}")
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$major" -lt 20 ]; then
    missing+=("node>=20 (found $(node --version))")
  elif [ ! -d libs/lambda-runtime-js/node_modules/typescript ] ||
    [ ! -d libs/lambda-runtime-js/node_modules/quicktype-core ] ||
    [ libs/lambda-runtime-js/package-lock.json -nt libs/lambda-runtime-js/node_modules/.package-lock.json ]; then
    echo "install_runtime_deps: npm ci in libs/lambda-runtime-js" >&2
    (cd libs/lambda-runtime-js && npm ci --no-audit --no-fund --loglevel=error) || missing+=("npm ci")
  fi
else
  missing+=("node>=20 and npm")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install_runtime_deps: missing ${missing[*]}: those runtime tests skip (fail with CI=true)" >&2
  exit 1
fi
