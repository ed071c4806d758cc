"""Build the TypeScript and Rust operator runtimes for the tests, once per session.

Invariants: builds run the packages' own commands (`npm ci`, `npm run build`, `cargo build
--offline`) in their directories, never a download of a toolchain, and each at most once per test
process (a successful build is cached); a missing toolchain skips the caller (fails it with
CI=true) with a one-line reason. A first Rust build takes a minute or two on a small machine:
callers' tests allow `BUILD_TIMEOUT` seconds.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[5]  # the repository, above tools/testkit/src/taskplat/
JS_DIR = ROOT / "libs" / "lambda-runtime-js"
RS_DIR = ROOT / "libs" / "lambda-runtime-rs"
PY_OPERATOR_DIR = ROOT / "libs" / "lambda-runtime" / "examples"
PY_OPERATOR = PY_OPERATOR_DIR / "example_operator.py"
DEBIAN_CARGO_REGISTRY = Path("/usr/share/cargo/registry")
BUILD_TIMEOUT = 1200


@dataclass(frozen=True)
class JsRuntime:
    node: str
    npm: str
    dir: Path
    operator: Path  # the example operator (serve when run, `handler` for Lambda)


@dataclass(frozen=True)
class RustRuntime:
    cargo: str
    dir: Path
    bootstrap: Path  # the example operator: serve, or the Lambda Runtime API loop


def missing(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: every runtime must be tested; run `make runtime-deps`)")
    pytest.skip(reason)


def run(argv: list[str], cwd: Path, what: str, timeout: float = 600) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(
            f"{what} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )


@functools.cache
def build_js() -> JsRuntime:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing("node and npm are not installed: the JavaScript runtime is not tested")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        missing(f"node {version} is older than 20: the JavaScript runtime is not tested")
    if not (JS_DIR / "node_modules" / "typescript").is_dir():
        run([npm, "ci", "--no-audit", "--no-fund"], JS_DIR, "npm ci")
    run([npm, "run", "build"], JS_DIR, "npm run build")
    return JsRuntime(node, npm, JS_DIR, JS_DIR / "examples" / "operator.mjs")


@functools.cache
def build_rust() -> RustRuntime:
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(cargo).exists():
        missing("cargo is not installed: the Rust runtime is not tested")
    if not (DEBIAN_CARGO_REGISTRY / "ureq-2.6.2").is_dir():
        missing(
            "Debian's librust-ureq-dev, librust-serde-json-dev and librust-serde-derive-dev are "
            "not installed (`make runtime-deps` as root): the Rust runtime is not tested"
        )
    run(
        [cargo, "build", "--offline", "--bins", "--tests"],
        RS_DIR,
        "cargo build",
        timeout=BUILD_TIMEOUT,
    )
    return RustRuntime(cargo, RS_DIR, RS_DIR / "target" / "debug" / "bootstrap")
