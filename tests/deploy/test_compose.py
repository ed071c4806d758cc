"""deploy/docker-compose.yml runs what ECS runs, with the settings of `make up`.

Checked: the file parses; it names every ECS container as a service with the same command, built
by the same Dockerfile, plus Postgres, the SQS emulator and the queue-creation step; every
variable is one the service reads and the result validates; every `make up` development default
(taskplat.devstack.stack.config) that a service reads has the same value; workers get no database
URL nor API keys; and the queue-creation step really creates the queues with their DLQs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import deploy_model
import pytest
from deploy_model import REPO, SPECS, Container

INFRASTRUCTURE = {"postgres", "localstack", "queues"}


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services = compose["services"]
    assert isinstance(services, dict)
    return services


def test_compose_names_every_ecs_container_and_the_infrastructure(
    compose: dict[str, Any], ecs_containers: list[Container]
) -> None:
    names = {container.name for container in ecs_containers}
    assert set(_services(compose)) == names | INFRASTRUCTURE


@pytest.mark.parametrize("name", sorted(SPECS))
def test_same_command_and_image_as_ecs(
    name: str, compose: dict[str, Any], ecs_containers: list[Container]
) -> None:
    service = _services(compose)[name]
    container = next(c for c in ecs_containers if c.name == name)
    assert service["command"] == [str(part) for part in container.definition["Command"]]
    spec = SPECS[name]
    expected_build: dict[str, Any] = {"context": "..", "dockerfile": spec.dockerfile_path}
    if spec.build_args:
        expected_build["args"] = spec.args
    assert service["build"] == expected_build
    assert service["image"] == f"{spec.image}:dev"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_variable_is_read_and_valid(
    name: str, compose: dict[str, Any], clean_settings_env: pytest.MonkeyPatch
) -> None:
    spec = SPECS[name]
    env = deploy_model.compose_environment(_services(compose)[name])
    allowed = spec.accepted_env() | deploy_model.PYTHON_RUNTIME_ENV
    if spec.uses_sqs:
        allowed |= deploy_model.BOTO_CREDENTIALS_ENV
    unknown = {variable for variable in env if variable.upper() not in allowed}
    assert not unknown, (
        f"{name}: {sorted(unknown)} are read by no settings class of {spec.settings}"
    )
    # Compose passes the whole URL (no rotated credentials beside it).
    expected = spec.secrets - deploy_model.LIBPQ_CREDENTIALS
    assert deploy_model.SECRET_NAMES & set(env) == expected, f"{name}: {sorted(env)}"
    for variable, value in env.items():
        clean_settings_env.setenv(variable, value)
    for cls in spec.settings_classes():
        cls()


def test_settings_are_those_of_make_up(compose: dict[str, Any]) -> None:
    from taskplat.devstack.stack.config import DEFAULT_WORKERS, DEV_DEFAULTS, StackConfig

    stack = StackConfig(run_dir=REPO / ".run")
    shared = {
        "AWS_REGION": stack.aws_region,
        "TASKPLAT_SQS_QUEUE_PREFIX": stack.queue_prefix,
        "TASKPLAT_DEAD_LETTER_QUEUE": stack.dead_letter_queue,
    }
    checked = 0
    for name, spec in SPECS.items():
        # What the container sees: compose's value, else the image's ENV, else the default.
        image_env = spec.parsed_dockerfile().final.env()
        env = {**image_env, **deploy_model.compose_environment(_services(compose)[name])}
        accepted = spec.accepted_env()
        for variable, value in {**DEV_DEFAULTS, **shared}.items():
            if variable.endswith(("_HOST", "_PORT")):
                continue  # where a process listens differs by design (containers vs processes)
            if variable.upper() in accepted:
                effective = env.get(variable, str(spec.default_of(variable)))
                assert effective == value, f"{name}: {variable}={effective!r}, make up: {value!r}"
                checked += 1
    assert checked >= len(DEV_DEFAULTS)
    worker = _services(compose)["worker"]
    assert worker["deploy"]["replicas"] == DEFAULT_WORKERS
    queues = deploy_model.compose_environment(_services(compose)["queues"])["TASKPLAT_QUEUES"]
    assert tuple(queues.split(",")) == stack.queues
    assert f"max_receive_count={stack.max_receive_count}" in " ".join(
        _services(compose)["queues"]["command"]
    )


def test_one_shot_steps_gate_the_services(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in SPECS:
        if name == "migrate":
            continue
        depends = services[name]["depends_on"]
        gates = {
            gate
            for gate, rule in depends.items()
            if rule["condition"] in ("service_completed_successfully", "service_healthy")
        }
        assert gates & {"migrate", "dispatcher"}, f"{name} may start before the migrations"
        if SPECS[name].uses_sqs:
            assert "queues" in gates, f"{name} may start before its queues exist"


def test_queue_step_creates_the_queues_with_their_dlqs(
    compose: dict[str, Any], sqs_endpoint_url: str
) -> None:
    """Run the compose `queues` command itself against the test SQS endpoint."""
    import boto3

    service = _services(compose)["queues"]
    env = deploy_model.compose_environment(service)
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    env.update(
        SQS_ENDPOINT_URL=sqs_endpoint_url,
        TASKPLAT_SQS_QUEUE_PREFIX=prefix,
        TASKPLAT_DEAD_LETTER_QUEUE=f"{prefix}dead-letters",
        TASKPLAT_QUEUES="default,images",
    )
    command = list(service["command"])
    assert command[0] == "python"
    done = subprocess.run(
        [sys.executable, *command[1:]],
        env={**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    client = boto3.client(
        "sqs",
        endpoint_url=sqs_endpoint_url,
        region_name=env["AWS_REGION"],
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    names = {
        url.rsplit("/", 1)[1] for url in client.list_queues(QueueNamePrefix=prefix)["QueueUrls"]
    }
    assert names == {
        f"{prefix}default",
        f"{prefix}default-dlq",
        f"{prefix}images",
        f"{prefix}images-dlq",
        f"{prefix}dead-letters",
    }
    url = client.get_queue_url(QueueName=f"{prefix}default")["QueueUrl"]
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    redrive = json.loads(attributes["Attributes"]["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"].endswith(f":{prefix}default-dlq")
    for queue_url in client.list_queues(QueueNamePrefix=prefix)["QueueUrls"]:
        client.delete_queue(QueueUrl=queue_url)
