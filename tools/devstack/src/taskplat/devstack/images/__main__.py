"""``python -m taskplat.devstack.images``: ``build`` (`make images` without Docker) and ``up``
(`make up-images`).

Invariants: expected failures print ``images: error: ...`` on stderr and exit 1, never a
traceback; ``build`` prints each image's size, largest layers and labels and writes its SBOM to
``<out>/<image>.cdx.json``, and the names of the working containers its builds left behind (and it
then removed) to ``<out>/left-containers.json``: an empty list when the builds cleaned up.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.images import build, report

REPO = Path(__file__).resolve().parents[6]


def _revision(repo: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "unknown"


def _cmd_build(args: argparse.Namespace) -> int:
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "build.log"
    log.write_text("")
    candidates = [*build.IMAGES, *([build.EXAMPLE] if args.example else [])]
    specs = [spec for spec in candidates if not args.only or spec.name in args.only]
    bases = build.choose_bases(
        args.bases,
        uv=args.uv,
        uv_version=args.uv_version,
        log=log,
        refresh=args.refresh_base,
        node=build.EXAMPLE in specs,
    )
    left_out = out_dir / "left-containers.json"
    left_out.unlink(missing_ok=True)
    left = build.build_all(
        specs,
        repo=REPO,
        tag=args.tag,
        bases=bases,
        revision=_revision(REPO),
        version=args.version or args.tag,
        log=log,
    )
    left_out.write_text(json.dumps(left) + "\n")
    if left:
        print(f"images: the builds left {len(left)} working containers: removed", flush=True)
    tool = report.ensure_sbom_tool(args.uv, out_dir / "sbom-tool") if args.sbom else None
    for spec in specs:
        ref = f"localhost/{spec.name}:{args.tag}"
        print(report.describe(report.inspect(ref)), flush=True)
        if tool is not None:
            report.write_sbom(ref, tool, out_dir / f"{spec.name}.cdx.json")
    print(f"images: built {len(specs)} images; build log and SBOMs in {out_dir}", flush=True)
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    from taskplat.devstack.images.up import main as up

    return up(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m taskplat.devstack.images")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build every image with buildah")
    b.add_argument("--tag", default="dev")
    b.add_argument("--version", default="")
    b.add_argument("--bases", choices=("auto", "public", "debian"), default="auto")
    b.add_argument("--refresh-base", action="store_true", help="make the Debian base again")
    b.add_argument("--only", action="append", default=[], help="build only this image")
    b.add_argument(
        "--example",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the example worker image, taskplat-worker-example (default: yes)",
    )
    b.add_argument("--no-sbom", dest="sbom", action="store_false")
    b.add_argument("--uv", type=Path, default=REPO / ".tools" / "bin" / "uv")
    b.add_argument("--uv-version", required=True)
    b.add_argument("--out", type=Path, default=REPO / ".artifacts" / "images")
    b.set_defaults(func=_cmd_build)
    u = sub.add_parser("up", help="run the platform from the images with podman")
    u.add_argument("--tag", default="dev")
    u.add_argument("--run-dir", type=Path, default=REPO / ".run")
    u.add_argument("--workers", type=int, default=2)
    u.add_argument("--worker-image", default="", help="default: localhost/taskplat-worker-base")
    u.add_argument(
        "--example-workers",
        action="store_true",
        help="workers from localhost/taskplat-worker-example, with the capabilities to run "
        "untrusted operators as its second user",
    )
    u.set_defaults(func=_cmd_up)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except DevstackError as exc:
        print(f"images: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
