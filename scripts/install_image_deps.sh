#!/usr/bin/env bash
# Install and configure what `make images` and `make up-images` need without a Docker engine:
# Debian's buildah (builds the Dockerfiles), podman (runs the images), runc (the OCI runtime: crun
# refuses hybrid cgroups) and mmdebstrap (makes the Debian base when the pinned public bases cannot
# be pulled), when they are missing and we may (root with apt-get). Then it writes
# /etc/containers/containers.conf, unless one exists, so that podman run by hand works as the
# project's tools do: runtime runc, ulimits within a container host's hard limit (podman's
# defaults fail with "setrlimit ... operation not permitted" where the hard limit is lower).
# Prints what it did; exits 0 when every tool is present afterwards, 1 otherwise.
set -uo pipefail
TOOLS=(buildah podman runc mmdebstrap slirp4netns)
PACKAGES=(buildah podman runc catatonit mmdebstrap slirp4netns uidmap netavark aardvark-dns fuse-overlayfs)
have() {
  local tool
  for tool in "${TOOLS[@]}"; do command -v "$tool" >/dev/null 2>&1 || return 1; done
}
if ! have; then
  if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_image_deps: ${TOOLS[*]} missing; run as root on Debian, or:" >&2
    echo "  sudo apt-get install -y --no-install-recommends ${PACKAGES[*]}" >&2
    exit 1
  fi
  echo "install_image_deps: apt-get install ${PACKAGES[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null &&
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
fi
CONF=/etc/containers/containers.conf
if [ "$(id -u)" = "0" ] && [ ! -e "$CONF" ]; then
  echo "install_image_deps: writing $CONF (runtime runc, ulimits nofile/nproc 1024:4096)" >&2
  mkdir -p /etc/containers
  cat >"$CONF" <<'CONF'
# Written by Taskplat's scripts/install_image_deps.sh: crun refuses hybrid cgroups on this kind of
# host, and podman's default ulimits exceed its hard limit.
[containers]
default_ulimits = ["nofile=1024:4096", "nproc=1024:4096"]

[engine]
runtime = "runc"
CONF
fi
have
