#!/usr/bin/env bash
# Install Debian's Chromium and its matching chromedriver for the dashboard's browser tests, when
# they are missing and we may (root with apt-get). Prints what it did; exits 0 when both are
# present afterwards, 1 otherwise (the tests then skip, except in CI where they fail).
set -uo pipefail
have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }
if have; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_browser: chromium/chromedriver missing; run as root on Debian, or:" >&2
  echo "  sudo apt-get install -y chromium chromium-driver" >&2
  exit 1
fi
echo "install_browser: apt-get install chromium chromium-driver" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq chromium chromium-driver >/dev/null
have
