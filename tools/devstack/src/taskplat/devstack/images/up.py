"""`make up-images`: start the platform from its images, print and write `.run/stack.env`,
keep every container running (a container that exits is started again, as ECS replaces a task)
until Ctrl-C or SIGTERM, then stop everything.

Invariants: the settings are printed on stdout once every container is healthy, followed by each
container's start-to-healthy time; status and restarts go to stderr; the exit code is 0 after a
clean stop, 1 when the stack could not start.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from taskplat.devstack.images.stack import ImageStack
from taskplat.devstack.images.stack_config import (
    EXAMPLE_WORKER_IMAGE,
    USER_SWITCHING_CAPABILITIES,
    ImageStackConfig,
)


def main(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    worker_image: str = args.worker_image
    caps: tuple[str, ...] = ()
    if args.example_workers:  # the example image, untrusted operators as its second user
        worker_image = worker_image or f"{EXAMPLE_WORKER_IMAGE}:{args.tag}"
        caps = USER_SWITCHING_CAPABILITIES
    config = ImageStackConfig(
        run_dir=args.run_dir,
        tag=args.tag,
        workers=args.workers,
        worker_image=worker_image,
        worker_capabilities=caps,
    )
    print(
        "up-images: starting Postgres, the local AWS endpoint and the containers", file=sys.stderr
    )
    with ImageStack(config) as stack:
        for name, value in stack.info.as_env().items():
            print(f"{name}={value}", flush=True)
        for name, running in sorted(stack.containers.items()):
            after = running.healthy_after or 0.0
            print(f"# {name}: {running.definition.image} healthy after {after:.1f} s", flush=True)
        print(f"# written to {stack.info.env_file}; Ctrl-C stops every container", flush=True)
        while not stop.wait(2.0):
            for name in stack.supervise():
                print(f"up-images: {name} exited; started it again", file=sys.stderr, flush=True)
        print("up-images: stopping", file=sys.stderr, flush=True)
    return 0
