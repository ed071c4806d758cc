"""Build the TypeScript and Rust operator runtimes for the tests, once per session.

Invariants: builds run the packages' own commands (`npm ci`, `npm run build`, `cargo build
--offline`) in their directories, never a download of a toolchain, and each at most once per test
process (its outcome is kept); a missing toolchain skips the caller (fails it with CI=true) with a
one-line reason. The builds are the preparations "js-runtime" and "rust-runtime" of
`taskplat.testkit.prebuild`: a test marked ``@pytest.mark.prebuild("rust-runtime")`` has the
build started in the background when the session begins, and `build_rust()` waits for it. A first
Rust build takes a minute or two on a small machine: callers' tests allow `BUILD_TIMEOUT` seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, cast

import pytest

from taskplat.testkit import prebuild

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
    prebuild.run(argv, cwd, what, timeout)


def build_js() -> JsRuntime:
    """The built TypeScript runtime (waits for the background build when one was started)."""
    return cast(JsRuntime, prebuild.result("js-runtime", BUILD_TIMEOUT))


def build_rust() -> RustRuntime:
    """The built Rust runtime (waits for the background build when one was started)."""
    return cast(RustRuntime, prebuild.result("rust-runtime", BUILD_TIMEOUT))


def _build_js() -> JsRuntime:
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


def _build_rust() -> RustRuntime:
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


# The Rust build first: it is the long one.
prebuild.register("rust-runtime", _build_rust)
prebuild.register("js-runtime", _build_js)
