"""`podman run` arguments for one ECS container definition (`cfn.ContainerDef`).

Invariants:
- Everything ECS would apply comes from the definition: command, environment, user, read-only
  root filesystem (with no tmpfs podman would add on its own: `--read-only-tmpfs=false`), the
  task's volumes at their mount points, the container ports, the health check with its timings,
  the init process and the stop timeout.
- Secrets reach the container as environment from podman secrets (`type=env`), the way ECS
  injects Secrets Manager values: never as a plain `-e`, never in an image.
- What stands in for AWS is passed separately (`extra_env`: endpoint URLs, the local AWS
  endpoint's dummy keys), so what the task definition forgets is not silently supplied.
- Every container runs with the runc runtime and explicit ulimits (crun refuses hybrid cgroups;
  the default ulimits exceed a container host's hard limit), in its own network namespace that
  reaches the host's loopback at `HOST_ADDRESS` (slirp4netns), with its ports published on the
  host's 127.0.0.1 only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from taskplat.devstack.images.cfn import ContainerDef

PODMAN = ("podman", "--runtime", "runc")
ULIMITS = ("--ulimit", "nofile=1024:4096", "--ulimit", "nproc=1024:4096")
# The host's loopback as a container sees it (slirp4netns with allow_host_loopback).
HOST_ADDRESS = "10.0.2.2"
NETWORK = "slirp4netns:allow_host_loopback=true"
STACK_LABEL = "taskplat.images.stack"


@dataclass(frozen=True)
class RunPlan:
    """How one container of the local stack is started."""

    container_name: str  # podman's name of the container
    image: str
    extra_env: Mapping[str, str]  # stand-ins for AWS, not from the task definition
    secrets: Mapping[str, str]  # variable -> podman secret name
    host_ports: Mapping[int, int]  # container port -> host port on 127.0.0.1
    volume_names: Mapping[str, str]  # task volume -> podman volume
    stack_id: str
    cap_add: tuple[str, ...] = ()


def health_cmd(definition: ContainerDef) -> str | None:
    """The `--health-cmd` value: podman reads a JSON list as exec form, a string as a shell
    command (CMD-SHELL)."""
    health = definition.health
    if health is None:
        return None
    if health.shell:
        return " ".join(health.command)
    return json.dumps(health.command)


def run_args(definition: ContainerDef, plan: RunPlan) -> list[str]:
    """The full `podman ... run -d` command line of `definition` under `plan`."""
    missing = set(definition.secrets) - set(plan.secrets)
    if missing:
        raise ValueError(f"{definition.name}: no podman secret for {sorted(missing)}")
    args = [*PODMAN, "run", "--detach", "--name", plan.container_name]
    args += ["--label", f"{STACK_LABEL}={plan.stack_id}", "--hostname", definition.name]
    args += [*ULIMITS, "--network", NETWORK]
    if definition.read_only:
        args += ["--read-only", "--read-only-tmpfs=false"]
    if definition.user is not None:
        args += ["--user", definition.user]
    if definition.init:
        args.append("--init")
    if definition.stop_timeout is not None:
        args += ["--stop-timeout", str(definition.stop_timeout)]
    for cap in plan.cap_add:
        args += ["--cap-add", cap]
    for volume, path in definition.mounts:
        if volume not in definition.volumes:
            raise ValueError(f"{definition.name}: mount of an undeclared volume {volume}")
        args += ["--mount", f"type=volume,source={plan.volume_names[volume]},destination={path}"]
    for port in definition.ports:
        args += ["--publish", f"127.0.0.1:{plan.host_ports[port]}:{port}"]
    for name, value in {**definition.environment, **plan.extra_env}.items():
        args += ["--env", f"{name}={value}"]
    for name in sorted(definition.secrets):
        args += ["--secret", f"{plan.secrets[name]},type=env,target={name}"]
    command = health_cmd(definition)
    if command is not None and definition.health is not None:
        health = definition.health
        args += ["--health-cmd", command]
        args += [
            "--health-interval",
            f"{health.interval}s",
            "--health-timeout",
            f"{health.timeout}s",
        ]
        args += ["--health-retries", str(health.retries)]
        args += ["--health-start-period", f"{health.start_period}s"]
    args.append(plan.image)
    if definition.command is not None:
        args += definition.command
    return args
