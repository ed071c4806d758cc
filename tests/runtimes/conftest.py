"""Fixtures of the operator-runtime tests: the JavaScript package built (`npm ci` when its
node_modules are missing, then its ESM and CommonJS builds) and the Rust crate built (offline,
from Debian's librust-*-dev packages, see libs/lambda-runtime-rs/.cargo/config.toml).

Invariant: a missing toolchain (node/npm, cargo) or a missing librust registry skips these tests
with the reason, except with CI=true, where it fails them: CI must test all three runtimes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from taskplat.testkit.runtime_builds import JsRuntime, RustRuntime, build_js, build_rust


@pytest.fixture(scope="session")
def js_runtime() -> JsRuntime:
    return build_js()


@pytest.fixture(scope="session")
def rust_runtime() -> RustRuntime:
    return build_rust()


@pytest.fixture(scope="session")
def runtime_tests_dir() -> Path:
    return Path(__file__).parent
