"""What `make images` builds and how `make up-images` starts each container, checked without
podman: the image table against the deployment model, and the ECS task definitions resolved and
turned into `podman run` arguments (taskplat.devstack.images).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import deploy_model
import pytest
from deploy_model import SPECS

from taskplat.devstack.images import build, cfn
from taskplat.devstack.images.podman import RunPlan, run_args
from taskplat.devstack.images.stack import ImageStack, secret_arn
from taskplat.devstack.images.stack_config import ImageStackConfig, WorkerPool

KEYS = {"TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID": "k1"}


def _platform(parameters: dict[str, str]) -> dict[str, cfn.ContainerDef]:
    template = cfn.load_template(deploy_model.TEMPLATE_DIR / "platform.yaml")
    containers = cfn.task_containers(cfn.Resolver(template, parameters))
    return {c.name: c for c in containers if c.name != "collector"}


@pytest.fixture(scope="module")
def local_parameters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    stack = ImageStack(ImageStackConfig(run_dir=tmp_path_factory.mktemp("run")))
    return stack.parameters(KEYS)


def test_images_are_the_makefiles_with_the_same_build_arguments() -> None:
    by_image = {spec.image: spec for spec in SPECS.values()}
    assert {image.name for image in build.IMAGES} == set(by_image)
    for image in build.IMAGES:
        spec = by_image[image.name]
        assert image.dockerfile == spec.dockerfile_path, image.name
        assert dict(image.args) == spec.args, image.name


def test_debian_base_name_follows_its_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    first = build.debian_base_ref()
    assert first == build.debian_base_ref()
    monkeypatch.setattr(build, "DEBIAN_PACKAGES", (*build.DEBIAN_PACKAGES, "tzdata"))
    assert build.debian_base_ref() != first


def test_every_platform_container_runs_from_the_local_images(
    local_parameters: dict[str, str],
) -> None:
    containers = _platform(local_parameters)
    service_names = {name for name in SPECS if name != "worker"}
    assert set(containers) == service_names
    for name, container in containers.items():
        assert container.image == f"localhost/{SPECS[name].image}:dev", name
        assert container.read_only, f"{name} has a writable root filesystem"


def test_conditions_drop_what_a_stack_does_not_configure(local_parameters: dict[str, str]) -> None:
    without = {**local_parameters, "CapabilityTokenKeysSecretArn": "", "DataBucketName": ""}
    dispatcher = _platform(without)["dispatcher"]
    assert "TASKPLAT_CAPABILITY_TOKEN_KEYS" not in dispatcher.secrets
    assert "TASKPLAT_DATA_BUCKET" not in dispatcher.environment
    dispatcher = _platform(local_parameters)["dispatcher"]
    assert dispatcher.secrets["TASKPLAT_CAPABILITY_TOKEN_KEYS"] == secret_arn(
        "capability-token-keys"
    )
    assert dispatcher.environment["TASKPLAT_DATA_BUCKET"] == local_parameters["DataBucketName"]


def _plan(container: cfn.ContainerDef) -> RunPlan:
    return RunPlan(
        container_name=f"t-{container.name}",
        image=container.image,
        extra_env={"AWS_ENDPOINT_URL": "http://10.0.2.2:4566"},
        secrets={name: f"s-{name.lower()}" for name in container.secrets},
        host_ports={port: 20000 + port % 1000 for port in container.ports},
        volume_names={volume: f"v-{volume}" for volume in container.volumes},
        stack_id="t",
    )


def _values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]


def test_run_arguments_are_the_task_definitions(local_parameters: dict[str, str]) -> None:
    dispatcher = _platform(local_parameters)["dispatcher"]
    args = run_args(dispatcher, _plan(dispatcher))
    assert args[:3] == ["podman", "--runtime", "runc"]
    assert "--read-only" in args and "--read-only-tmpfs=false" in args
    assert "--init" in args and _values(args, "--stop-timeout") == ["30"]
    assert _values(args, "--mount") == ["type=volume,source=v-tmp,destination=/tmp"]
    assert _values(args, "--publish") == ["127.0.0.1:20080:8080"]
    env = dict(value.split("=", 1) for value in _values(args, "--env"))
    assert env["TASKPLAT_DISPATCHER_PORT"] == "8080"
    assert env["AWS_ENDPOINT_URL"] == "http://10.0.2.2:4566"
    # Secrets only as podman secrets injected as environment, never as plain variables.
    assert not set(env) & set(dispatcher.secrets)
    assert "s-database_url,type=env,target=DATABASE_URL" in _values(args, "--secret")
    assert dispatcher.health is not None
    assert json.loads(_values(args, "--health-cmd")[0]) == dispatcher.health.command
    assert _values(args, "--health-start-period") == ["20s"]
    assert args[-2:] == ["localhost/taskplat-dispatcher:dev", "taskplat-dispatcher"]


def test_run_arguments_refuse_a_secret_without_a_value(local_parameters: dict[str, str]) -> None:
    dispatcher = _platform(local_parameters)["dispatcher"]
    plan = replace(_plan(dispatcher), secrets={})
    with pytest.raises(ValueError, match="no podman secret"):
        run_args(dispatcher, plan)


def test_worker_pool_gives_the_data_services_urls_and_a_read_only_root() -> None:
    template = cfn.load_template(deploy_model.TEMPLATE_DIR / "worker-pool.yaml")
    imports = {
        name: f"value-of-{name}"
        for name in (
            "p-SqsQueuePrefix",
            "p-InternalDispatcherUrl",
            "p-WorkerTokenSecretArn",
            "p-CredentialBrokerUrl",
            "p-QueryServiceUrl",
            "p-CollectorConfigParameterArn",
            "q-TaskQueue",
        )
    }
    parameters = {
        "PlatformStackName": "p",
        "QueueStackName": "q",
        "WorkerImage": "example/worker:1",
        "WorkerRepositoryName": "worker",
        "PlatformDataServices": "true",
    }
    containers = cfn.task_containers(cfn.Resolver(template, parameters, imports))
    (worker,) = [c for c in containers if c.name == "worker"]
    assert worker.image == "example/worker:1"
    assert worker.environment["TASKPLAT_QUERY_URL"] == "value-of-p-QueryServiceUrl"
    assert worker.environment["TASKPLAT_CREDENTIALS_URL"] == "value-of-p-CredentialBrokerUrl"
    assert worker.read_only
    assert dict((path, volume) for volume, path in worker.mounts) == {
        "/home/taskplat/scratch": "scratch",
        "/tmp": "tmp",
    }
    missing = {k: v for k, v in imports.items() if k != "p-QueryServiceUrl"}
    with pytest.raises(cfn.TemplateError, match="p-QueryServiceUrl"):
        cfn.task_containers(cfn.Resolver(template, parameters, missing))


def test_the_example_image_builds_on_the_base_with_the_runtimes_as_a_named_context() -> None:
    repo = deploy_model.REPO
    bases = build.Bases("localhost/debian:x", "localhost/uv:y", "localhost/taskplat-node:z")
    args = {**bases.args(), "BASE_IMAGE": "localhost/taskplat-worker-base:dev"}
    argv = build.build_argv(build.EXAMPLE, repo=repo, tag="dev", build_args=args, ca=None)
    assert argv[argv.index("--build-context") + 1] == f"taskplat-libs={repo / 'libs'}"
    assert argv[-1] == str(repo / "deploy" / "worker-example")
    assert "NODE_IMAGE=localhost/taskplat-node:z" in argv
    assert "BASE_IMAGE=localhost/taskplat-worker-base:dev" in argv
    # The public bases: the Dockerfiles' own defaults, no build argument names them.
    assert build.Bases(None, None).args() == {}


def test_a_further_worker_pool_serves_its_own_registered_queue(tmp_path: Path) -> None:
    pool = WorkerPool("example-worker", "localhost/example:dev", "example", capabilities=("KILL",))
    stack = ImageStack(ImageStackConfig(run_dir=tmp_path, pools=(pool,)))
    assert stack.parameters(KEYS)["TaskQueues"] == "default,example"
    names = ["SqsQueuePrefix", "InternalDispatcherUrl", "WorkerTokenSecretArn"]
    names += ["CredentialBrokerUrl", "QueryServiceUrl", "CollectorConfigParameterArn"]
    imports = {f"taskplat-{name}": f"value-of-{name}" for name in names}
    imports["taskplat-queue-TaskQueue"] = pool.queue
    parameters = {**stack.worker_parameters(), "WorkerImage": pool.image}
    template = cfn.load_template(deploy_model.TEMPLATE_DIR / "worker-pool.yaml")
    containers = cfn.task_containers(cfn.Resolver(template, parameters, imports))
    (worker,) = [c for c in containers if c.name == "worker"]
    assert worker.image == "localhost/example:dev"
    plan = RunPlan(
        container_name="c",
        image=worker.image,
        extra_env={},
        secrets={name: "s" for name in worker.secrets},
        host_ports={port: port for port in worker.ports},
        volume_names={volume: volume for volume in worker.volumes},
        stack_id="t",
        cap_add=pool.capabilities,
    )
    argv = run_args(worker, plan)
    assert argv[argv.index("--cap-add") + 1] == "KILL"
