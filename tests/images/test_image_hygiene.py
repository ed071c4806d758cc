"""Every image `make images` built (the example worker image included): a non-root user, no
compiler, pip, uv, npm, cargo, test or dev dependency (an operator's node_modules holds the
operator runtime only), labels naming the source revision and version, a CycloneDX SBOM beside
it; sizes are printed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from images_support import REPORT, TAG

from taskplat.devstack.images import build, report
from taskplat.devstack.images.podman import PODMAN, ULIMITS

REPO = Path(__file__).resolve().parents[2]
SBOM_DIR = REPO / ".artifacts" / "images"
# Every service image, the worker base and the example worker image (deploy/worker-example).
SPECS = [*build.IMAGES, build.EXAMPLE]
IMAGES = [f"localhost/{spec.name}:{TAG}" for spec in SPECS]
# Programs no runtime image may hold, and distributions no virtualenv of one may hold.
FORBIDDEN_PROGRAMS: tuple[str, ...] = ("gcc", "cc", "c++", "g++", "clang", "make", "pip", "pip3")
FORBIDDEN_PROGRAMS += ("uv", "uvx", "rustc", "cargo", "ld", "npm", "npx", "corepack", "tsc", "yarn")
FORBIDDEN_DISTRIBUTIONS = ("pip", "pytest", "mypy", "ruff", "hypothesis", "setuptools", "uv")
# The only npm packages an image may hold (in an operator's node_modules): the operator runtime.
ALLOWED_NODE_MODULES = {"@taskplat"}


def _sh(image: str, script: str) -> str:
    argv = [*PODMAN, "run", "--rm", "--read-only", "--network", "none", *ULIMITS]
    argv += ["--entrypoint", "sh", image, "-c", script]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_a_non_root_user_and_says_what_it_is(image: str) -> None:
    facts = report.inspect(image)
    REPORT["sizes"].append(report.describe(facts))
    uid = facts.user.split(":")[0]
    assert uid and uid not in ("0", "root"), f"{image} runs as {facts.user or 'root'}"
    assert _sh(image, "id -u").strip() not in ("", "0")
    revision = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert facts.labels.get("org.opencontainers.image.revision") == revision, facts.labels
    assert facts.labels.get("org.opencontainers.image.version"), facts.labels


@pytest.mark.parametrize("image", IMAGES)
def test_holds_no_build_tool_nor_test_dependency(image: str) -> None:
    found = _sh(image, " ; ".join(f"command -v {name} || true" for name in FORBIDDEN_PROGRAMS))
    assert not found.strip(), f"{image} holds {found.split()}"
    listing = _sh(
        image,
        "ls /app/.venv/lib/python3*/site-packages /usr/local/lib/python3*/site-packages "
        "/usr/lib/python3/dist-packages 2>/dev/null || true",
    )
    names = {line.strip().split("-")[0].lower() for line in listing.splitlines()}
    assert not names & set(FORBIDDEN_DISTRIBUTIONS), (
        f"{image}: {names & set(FORBIDDEN_DISTRIBUTIONS)}"
    )
    # No npm, no compiler toolchain nor dev package of npm's or Rust's anywhere.
    found = _sh(
        image,
        "find / -xdev \\( -name node_modules -o -name .cargo -o -name .rustup \\) -prune -print "
        '| while read -r d; do echo "$d"; ls -A "$d"; done',
    )
    lines = found.split()
    dirs = [line for line in lines if line.startswith("/")]
    assert not [d for d in dirs if not d.endswith("/node_modules")], f"{image}: {dirs}"
    assert set(lines) - set(dirs) <= ALLOWED_NODE_MODULES, f"{image}: {found}"


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_has_a_cyclonedx_sbom_of_its_packages(spec: build.ImageSpec) -> None:
    path = SBOM_DIR / f"{spec.name}.cdx.json"
    assert path.is_file(), f"no SBOM at {path}: run `make images`"
    document = json.loads(path.read_text())
    assert document["bomFormat"] == "CycloneDX"
    names = {component["name"] for component in document.get("components", [])}
    worker = spec.name in ("taskplat-worker-base", build.EXAMPLE.name)
    package = "taskplat-worker-wrapper" if worker else spec.name
    assert package in names, sorted(names)[:20]


def test_no_build_left_a_working_container_behind() -> None:
    """The builds of `make images` leave no working container: a stage named only for `COPY
    --from` (the uv image's) left its working container after every build, mounted, before the
    builds passed `--force-rm`. The build records the containers that appeared during it and were
    still there at its end (containers of earlier builds in the same store do not count)."""
    record = SBOM_DIR / "left-containers.json"
    assert record.is_file(), f"no {record}: run `make images`"
    left = json.loads(record.read_text())
    assert left == [], f"working containers left by this build's buildah runs: {left}"
