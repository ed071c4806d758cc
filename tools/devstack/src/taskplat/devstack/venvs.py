"""Cached, self-contained virtualenvs for the SQS servers (LocalStack, and moto as a fallback).

Invariants:
- A venv is usable only when its stamp file holds exactly the interpreter, the install flags
  and the pinned requirement list it was built for; any other content (a changed pin, another
  interpreter, an install cut short) means it is rebuilt from scratch.
- Builds are serialized by a file lock next to the venv (``<venv>.lock``): two processes never
  install into the same venv at once, and the second one reuses what the first one built.
- The stamp is written last, atomically, so a crashed install never looks complete.
- Venvs are created with uv (``uv venv`` + ``uv pip install``), never by pip into the project env,
  and uv is never allowed to download an interpreter.
- ``install_workspace_package`` makes a venv that holds a non-editable copy of a workspace package
  and its locked dependencies: nothing in it points back into the checkout, so another user can
  run it from a checkout they cannot enter (a mode-700 clone, root's home).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from filelock import FileLock, Timeout

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.procs import read_tail

LOCALSTACK_REQUIREMENTS: tuple[str, ...] = (
    "localstack-core[base-runtime]==2026.3.0",
    # Pins localstack-core 2026.3.0 needs on Python 3.13 but does not declare: with the newest
    # cbor2/pyopenssl/cryptography its runtime loads no component plugins and exits at once.
    "cbor2<6",
    "pyopenssl<25",
    "cryptography<45",
    "service_identity",
)
MOTO_REQUIREMENTS: tuple[str, ...] = ("moto[server]>=5.0,<6",)
STAMP_NAME = ".taskplat-devstack-stamp"
INSTALL_TIMEOUT = 1200.0
_INSTALL_FLAGS = ("--compile-bytecode",)  # pay for .pyc files at install time, not at first start


def repo_root() -> Path | None:
    """The uv workspace root above this file (editable or .venv install), else above the cwd."""
    for start in (Path(__file__).resolve().parent, Path.cwd()):
        for directory in [start, *start.parents]:
            pyproject = directory / "pyproject.toml"
            try:
                if "[tool.uv.workspace]" in pyproject.read_text():
                    return directory
            except OSError:
                continue
    return None


def default_localstack_venv() -> Path:
    """``$TASKPLAT_LOCALSTACK_VENV``, else ``<repo>/.cache/localstack-venv``, else a user cache."""
    if override := os.environ.get("TASKPLAT_LOCALSTACK_VENV"):
        return Path(override).absolute()
    root = repo_root()
    base = root / ".cache" if root else Path.home() / ".cache" / "taskplat"
    return base / "localstack-venv"


def find_uv(uv: str | None = None) -> str:
    """The uv executable: the argument, ``$UV``, ``uv`` on PATH, then ``<repo>/.tools/bin/uv``."""
    root = repo_root()
    candidates = [uv, os.environ.get("UV"), shutil.which("uv")]
    if root is not None:
        candidates.append(str(root / ".tools" / "bin" / "uv"))
    for candidate in candidates:
        if candidate and (found := shutil.which(candidate)):
            return found
    raise DevstackError("uv not found: pass --uv, set UV, put uv on PATH, or run `make` first")


def _version_key(path: str) -> tuple[int, ...]:
    name = Path(path).parents[1].name  # ~/.pyenv/versions/<name>/bin/python3.13
    parts = name.split(".")
    if not all(p.isdigit() for p in parts):
        return (-1,)  # 3.13-dev, 3.13.0t, ...: only if nothing plain is there
    return tuple(int(p) for p in parts)


def _python_candidates(version: str) -> list[str]:
    exe = f"python{version}"
    if override := os.environ.get(f"TASKPLAT_PYTHON{version.replace('.', '')}"):
        return [override]  # set explicitly: that one or none
    found: list[str] = []
    if on_path := shutil.which(exe):
        found.append(on_path)
    pyenv_roots = {os.environ.get("PYENV_ROOT") or "", str(Path.home() / ".pyenv")} - {""}
    for root in sorted(pyenv_roots):
        pattern = Path(root) / "versions"
        matches = [str(p) for p in pattern.glob(f"{version}*/bin/{exe}")]
        found += sorted(matches, key=_version_key, reverse=True)
    found += [f"/usr/bin/{exe}", f"/usr/local/bin/{exe}"]
    return found


def find_python(version: str = "3.13") -> str:
    """An interpreter of ``version`` that actually runs (a pyenv shim on PATH may not)."""
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    for candidate in _python_candidates(version):
        if not os.access(candidate, os.X_OK):
            continue
        try:
            result = subprocess.run(
                [candidate, "-c", probe], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if result.returncode == 0 and result.stdout.strip() == version:
            return candidate
    raise DevstackError(
        f"no working python{version} found (PATH, ~/.pyenv/versions/{version}*, /usr/bin); "
        f"set TASKPLAT_PYTHON{version.replace('.', '')} to one"
    )


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def _stamp_text(python: str, requirements: Sequence[str], flags: Sequence[str]) -> str:
    lines = [f"python={python}", f"flags={' '.join(flags)}", *requirements]
    return "\n".join(lines) + "\n"


def _is_complete(venv_dir: Path, stamp: str) -> bool:
    try:
        current = (venv_dir / STAMP_NAME).read_text()
    except OSError:
        return False
    return current == stamp and os.access(venv_python(venv_dir), os.X_OK)


def _run_logged(argv: list[str], log_path: Path, what: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    with log_path.open("ab") as log:
        offset = log.tell()
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        try:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=INSTALL_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DevstackError(f"{what} failed: {exc}") from exc
    if result.returncode != 0:
        tail = read_tail(log_path, offset=offset, lines=25)
        raise DevstackError(f"{what} failed (exit {result.returncode}); log {log_path}:\n{tail}")


def ensure_venv(
    venv_dir: Path,
    *,
    python: str,
    requirements: Sequence[str],
    uv: str | None = None,
    lock_timeout: float = INSTALL_TIMEOUT,
    flags: Sequence[str] = _INSTALL_FLAGS,
) -> Path:
    """Make ``venv_dir`` a venv of ``python`` with exactly ``requirements``; return its python."""
    venv_dir = venv_dir.absolute()
    stamp = _stamp_text(python, requirements, flags)
    if _is_complete(venv_dir, stamp):
        return venv_python(venv_dir)
    try:
        venv_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{venv_dir}.lock", timeout=lock_timeout):
            if _is_complete(venv_dir, stamp):  # built by another process while we waited
                return venv_python(venv_dir)
            uv_exe = find_uv(uv)
            log_path = venv_dir.parent / f"{venv_dir.name}.install.log"
            if venv_dir.exists():
                shutil.rmtree(venv_dir)
            _run_logged(
                [uv_exe, "venv", "--no-project", "--python", python, str(venv_dir)],
                log_path,
                f"creating {venv_dir}",
            )
            install = [uv_exe, "pip", "install", *flags]
            _run_logged(
                [*install, "--python", str(venv_python(venv_dir)), *requirements],
                log_path,
                f"installing {' '.join(requirements)} into {venv_dir}",
            )
            partial = venv_dir / f"{STAMP_NAME}.tmp"
            partial.write_text(stamp)
            partial.replace(venv_dir / STAMP_NAME)
    except Timeout as exc:
        raise DevstackError(f"another process holds {exc.lock_file} for too long") from exc
    except OSError as exc:
        raise DevstackError(f"cannot build {venv_dir}: {exc}") from exc
    return venv_python(venv_dir)


def ensure_localstack_venv(cache_dir: Path | None = None, *, uv: str | None = None) -> Path:
    """The python of a venv with LocalStack (``cache_dir`` is the venv directory itself;
    default ``default_localstack_venv()``), built on first use and reused afterwards."""
    venv_dir = Path(cache_dir) if cache_dir else default_localstack_venv()
    return ensure_venv(
        venv_dir, python=find_python("3.13"), requirements=LOCALSTACK_REQUIREMENTS, uv=uv
    )


def ensure_moto_venv(localstack_venv: Path | None = None, *, uv: str | None = None) -> Path:
    """The python of the fallback moto venv, a sibling ``moto-venv`` of the LocalStack venv."""
    sibling = (Path(localstack_venv) if localstack_venv else default_localstack_venv()).parent
    try:
        python = find_python("3.13")
    except DevstackError:
        python = sys.executable  # moto runs on any supported Python, 3.11 included
    # No bytecode compiled ahead: a fallback that may run once should not pay for all of boto3's.
    return ensure_venv(
        sibling / "moto-venv", python=python, requirements=MOTO_REQUIREMENTS, uv=uv, flags=()
    )


def install_workspace_package(
    venv_dir: Path, *, python: str, package: str, uv: str | None = None
) -> Path:
    """Make ``venv_dir`` a venv of ``python`` with a non-editable copy of the workspace
    ``package`` and the versions ``uv.lock`` pins for its dependencies; return its python.

    The copy is self-contained (readable wherever ``venv_dir`` is), unlike the workspace venv's
    editable installs, whose ``.pth`` files point into the checkout."""
    root = repo_root()
    if root is None:
        raise DevstackError("no uv workspace found above this file or the current directory")
    uv_exe = find_uv(uv)
    venv_dir = venv_dir.absolute()
    venv_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = venv_dir.parent / f"{venv_dir.name}.install.log"
    requirements = venv_dir.parent / f"{venv_dir.name}.requirements.txt"
    _run_logged(
        [uv_exe, "export", "--project", str(root), "--frozen", "--no-dev", "--no-editable",
         "--no-hashes", "--package", package, "--output-file", str(requirements)],
        log_path,
        f"exporting the locked requirements of {package}",
    )  # fmt: skip
    _run_logged(
        [uv_exe, "venv", "--no-project", "--python", python, str(venv_dir)],
        log_path,
        f"creating {venv_dir}",
    )
    # The exported file names workspace members by paths relative to the workspace root. uv
    # keeps a wheel it built from a local directory until that directory's pyproject.toml
    # changes, not its code: the members are rebuilt every time (`--refresh-package`), so the
    # copy is the checkout as it is now.
    refresh = [
        flag
        for name in _workspace_members(root, requirements)
        for flag in ("--refresh-package", name)
    ]
    _run_logged(
        [uv_exe, "pip", "install", "--python", str(venv_python(venv_dir)),
         "--no-sources", "--directory", str(root), *refresh, "-r", str(requirements)],
        log_path,
        f"installing {package} into {venv_dir}",
    )  # fmt: skip
    return venv_python(venv_dir)


def _workspace_members(root: Path, requirements: Path) -> list[str]:
    """The project names of the workspace members an exported requirements file installs (the
    lines that are paths)."""
    names = []
    for line in requirements.read_text(encoding="utf-8").splitlines():
        if line.startswith("./"):
            project = tomllib.loads((root / line / "pyproject.toml").read_text(encoding="utf-8"))
            names.append(str(project["project"]["name"]))
    return names
