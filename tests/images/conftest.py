"""Fixtures of `make test-images`: the platform from its images (taskplat.devstack.images), one
stack for the session, supervised like an ECS service (a container that exits is started again).
Its workers: two of the worker base on the task queue `default`, and a pool of the example worker
image (deploy/worker-example) on its own queue `example` (EXAMPLE_QUEUE), with the capabilities to
run untrusted operators as the image's second user.

Invariants: these tests run only under `make test-images` (TASKPLAT_IMAGES_TESTS=1), never in
`make test`: they need podman and the images `make images` built with tag IMAGE_TAG. What they
measure (each image's size, each container's start-to-healthy time) is printed at the end of the
session, never asserted.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from images_support import EXAMPLE_QUEUE, REPORT, TAG

from taskplat.devstack.images.stack import ImageStack
from taskplat.devstack.images.stack_config import (
    EXAMPLE_WORKER_IMAGE,
    USER_SWITCHING_CAPABILITIES,
    ImageStackConfig,
    WorkerPool,
)

if os.environ.get("TASKPLAT_IMAGES_TESTS") != "1":
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def image_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageStack]:
    run_dir: Path = tmp_path_factory.mktemp("images-run")
    example = WorkerPool(
        "example-worker",
        f"{EXAMPLE_WORKER_IMAGE}:{TAG}",
        EXAMPLE_QUEUE,
        count=1,
        capabilities=USER_SWITCHING_CAPABILITIES,
    )
    stack = ImageStack(ImageStackConfig(run_dir=run_dir, tag=TAG, workers=2, pools=(example,)))
    stack.start()
    for name, running in sorted(stack.containers.items()):
        REPORT["healthy"].append(
            f"{name:<18} {running.definition.image:<48} healthy after "
            f"{running.healthy_after or 0:.1f} s"
        )
    stop = threading.Event()

    def supervise() -> None:
        while not stop.wait(1.0):
            stack.supervise()

    thread = threading.Thread(target=supervise, name="supervise", daemon=True)
    thread.start()
    try:
        yield stack
    finally:
        stop.set()
        thread.join(timeout=30)
        stack.stop()


@pytest.fixture(scope="session")
def api(image_stack: ImageStack) -> Iterator[httpx.Client]:
    info = image_stack.info
    headers = {"Authorization": f"Bearer {info.api_key}"}
    with httpx.Client(base_url=info.dispatcher_url, headers=headers, timeout=10.0) as client:
        yield client


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for title, key in (("image sizes", "sizes"), ("start to healthy", "healthy")):
        if REPORT[key]:
            terminalreporter.section(title)
            for line in REPORT[key]:
                terminalreporter.write_line(line)
