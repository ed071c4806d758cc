"""What `make images` reports about each image: its size, its largest layers, its labels, and a
CycloneDX SBOM written beside the build's other outputs.

Invariants: sizes are podman's (uncompressed, all layers); the SBOM is made by cyclonedx-py
(CycloneDX's own Python generator, PyPI `cyclonedx-bom`, pinned here) run inside the image
itself against `/app/.venv`, with the generator mounted read-only from the host (so it is in no
image), as root of the throwaway container only for reading.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.images.podman import PODMAN, ULIMITS

SBOM_GENERATOR = "cyclonedx-bom==7.5.0"


@dataclass(frozen=True)
class Layer:
    size: int
    created_by: str


@dataclass(frozen=True)
class ImageFacts:
    ref: str
    size: int
    layers: list[Layer]
    labels: dict[str, str]
    user: str


def inspect(ref: str) -> ImageFacts:
    out = subprocess.run(
        [*PODMAN, "image", "inspect", ref], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise DevstackError(f"no image {ref}: {out.stderr.strip()}")
    data: dict[str, Any] = json.loads(out.stdout)[0]
    history = subprocess.run(
        [*PODMAN, "history", "--format", "json", ref], capture_output=True, text=True, check=True
    )
    layers = [
        Layer(int(item.get("size", 0)), str(item.get("CreatedBy", item.get("createdBy", ""))))
        for item in json.loads(history.stdout)
    ]
    config = data.get("Config") or {}
    return ImageFacts(
        ref=ref,
        size=int(data["Size"]),
        layers=layers,
        labels=dict(config.get("Labels") or data.get("Labels") or {}),
        user=str(config.get("User", "")),
    )


def mib(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB"


def describe(facts: ImageFacts, largest: int = 3) -> str:
    lines = [f"{facts.ref}: {mib(facts.size)}, user {facts.user or 'root'}"]
    revision = facts.labels.get("org.opencontainers.image.revision", "?")
    version = facts.labels.get("org.opencontainers.image.version", "?")
    lines.append(f"  revision {revision[:12]}, version {version}")
    for layer in sorted(facts.layers, key=lambda item: item.size, reverse=True)[:largest]:
        step = " ".join(layer.created_by.split())[:90]
        lines.append(f"  {mib(layer.size):>10}  {step}")
    return "\n".join(lines)


def ensure_sbom_tool(uv: Path, target: Path) -> Path:
    marker = target / ".installed"
    if marker.exists() and marker.read_text() == SBOM_GENERATOR:
        return target
    argv = [str(uv), "pip", "install", "--quiet", "--python", "python3", "--target", str(target)]
    out = subprocess.run([*argv, SBOM_GENERATOR], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise DevstackError(f"cannot install {SBOM_GENERATOR}: {out.stderr.strip()[-1000:]}")
    marker.write_text(SBOM_GENERATOR)
    return target


def write_sbom(ref: str, tool: Path, output: Path) -> None:
    """CycloneDX JSON of the image's virtualenv, made inside the image."""
    argv = [*PODMAN, "run", "--rm", "--user", "0", "--read-only", "--network", "none", *ULIMITS]
    argv += [
        "--volume",
        f"{tool.resolve()}:/opt/sbom-tool:ro",
        "--env",
        "PYTHONPATH=/opt/sbom-tool",
    ]
    argv += ["--entrypoint", "python", ref, "-m", "cyclonedx_py", "environment"]
    argv += ["--output-format", "JSON", "--output-reproducible", "/app/.venv"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise DevstackError(f"no SBOM for {ref}: {out.stderr.strip()[-1000:]}")
    document = json.loads(out.stdout)
    if document.get("bomFormat") != "CycloneDX":
        raise DevstackError(f"the SBOM of {ref} is not CycloneDX")
    output.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
