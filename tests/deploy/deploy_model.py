"""What tests/deploy checks the deployment files against: the services, their entry points and
settings, and readers for the CloudFormation templates, the Dockerfiles and the compose file.

Invariants: everything here is read from the repository as it is (pyproject scripts, settings
classes, uv.lock); the only hand-written facts are the `SPECS` table (which container runs which
service), `UPCOMING` (containers the templates already run for services not yet in services/) and
the short allow-lists of variables read by the runtime rather than by a settings class. Nothing
needs AWS, Docker or the network.

`containers()` returns the service containers: not the telemetry collector sidecars
(`collectors()`), and not the containers of an `UPCOMING` service while its directory does not
exist. Once `services/<dir>` exists its container counts like any other, so every check (and the
need for a `SPECS` entry) applies to it at once.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, AliasPath
from pydantic_settings import BaseSettings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
TEMPLATE_DIR = DEPLOY / "cloudformation"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
# The deploy pages: the how-to guides and the reference pages made from the deployment guide.
DOCS = (
    REPO / "docs" / "how-to" / "deploy-ecs.md",
    REPO / "docs" / "how-to" / "scale.md",
    REPO / "docs" / "how-to" / "rotate-keys.md",
    REPO / "docs" / "reference" / "worker-images.md",
    REPO / "docs" / "reference" / "alarms.md",
)

# Read by the interpreter or boto3, not by a settings class.
PYTHON_RUNTIME_ENV = frozenset({"PATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})
BOTO_CREDENTIALS_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"})
SECRET_NAMES = frozenset(
    {
        "DATABASE_URL",
        "TASKPLAT_WORKER_TOKEN",
        "TASKPLAT_API_KEYS",
        "TASKPLAT_CAPABILITY_TOKEN_KEYS",
        "TASKPLAT_ATTEMPT_TOKEN_KEYS",
        "TASKPLAT_QUERY_DATABASE_URL",
    }
)
# Read by libpq when the URL names no user or password: the database role's rotated credentials,
# injected from the keys of a JSON secret (DatabaseCredentialsSecretArn) next to DATABASE_URL.
LIBPQ_CREDENTIALS = frozenset({"PGUSER", "PGPASSWORD"})


@dataclass(frozen=True)
class ServiceSpec:
    """One deployable process: its container name, image, Dockerfile, entry point, settings."""

    name: str  # ECS container name = compose service name
    service_dir: str  # services/<dir> whose Dockerfile builds the image
    image: str  # repository name of the image
    script: str  # console script the container runs
    script_package: str  # pyproject that declares `script`
    settings: tuple[str, ...]  # "module:Class" of every settings class the process reads
    secrets: frozenset[str]  # secret names it must get, and the only ones it may get
    uses_sqs: bool = False
    devstack_module: str | None = None  # `python -m` module the local stack runs
    health_port_env: str | None = None  # setting of the port serving its /healthz
    # --build-arg values of the shared Python service Dockerfile (SERVICE, LISTEN_PREFIX, PORT);
    # empty: the service directory's own Dockerfile (the worker base image).
    build_args: tuple[tuple[str, str], ...] = ()

    @property
    def args(self) -> dict[str, str]:
        return dict(self.build_args)

    @property
    def dockerfile_path(self) -> str:
        """The Dockerfile builds name (relative to the repository root): the shared file for
        the Python services (BuildKit does not reliably follow a symlinked Dockerfile)."""
        if self.build_args:
            return SHARED_DOCKERFILE
        return f"services/{self.service_dir}/Dockerfile"

    @property
    def dockerfile(self) -> Path:
        return REPO / self.dockerfile_path

    def parsed_dockerfile(self) -> Dockerfile:
        """The Dockerfile with this service's build arguments applied."""
        return parse_dockerfile(self.dockerfile, self.args)

    def settings_classes(self) -> list[type[BaseSettings]]:
        classes = []
        for ref in self.settings:
            module, _, name = ref.partition(":")
            classes.append(getattr(importlib.import_module(module), name))
        return classes

    def default_of(self, variable: str) -> Any:
        """The default a settings class of this service gives `variable` when it is unset."""
        for cls in self.settings_classes():
            for name, info in cls.model_fields.items():
                if variable.upper() in settings_env_names_of_field(cls, name):
                    return info.get_default(call_default_factory=True)
        raise LookupError(f"{self.name} reads no {variable}")

    def accepted_env(self) -> set[str]:
        names: set[str] = set()
        for cls in self.settings_classes():
            names |= settings_env_names(cls)
        return names


SHARED_DOCKERFILE = "deploy/docker/python-service.Dockerfile"
# Read by no settings class of the worker wrapper: it passes them on to every operator
# (taskplat.worker_wrapper.operators.PLATFORM_URL_VARS).
OPERATOR_PASSTHROUGH_ENV = frozenset({"TASKPLAT_QUERY_URL", "TASKPLAT_CREDENTIALS_URL"})
# Variables an image sets for itself, read by no settings class (the HEALTHCHECK's probe).
IMAGE_ONLY_ENV = frozenset({"TASKPLAT_HEALTHCHECK_URL"})


def python_service_args(
    service_dir: str, listen_prefix: str, port: int
) -> tuple[tuple[str, str], ...]:
    return (("SERVICE", service_dir), ("LISTEN_PREFIX", listen_prefix), ("PORT", str(port)))


COLLECTOR = "collector"  # container name of the telemetry sidecar in every service task

# Containers the platform template runs for services whose code lands separately: container name
# -> services/<dir>. Checked only by tests/deploy/test_upcoming_services.py until the directory
# exists; from then on they need a SPECS entry like every other service.
UPCOMING: dict[str, str] = {"sink": "sink", "credential-broker": "credential-broker"}


def upcoming_and_absent(container_name: str) -> bool:
    service_dir = UPCOMING.get(container_name)
    return service_dir is not None and not (REPO / "services" / service_dir).is_dir()


SPECS: dict[str, ServiceSpec] = {
    spec.name: spec
    for spec in (
        ServiceSpec(
            "dispatcher",
            "dispatcher",
            "taskplat-dispatcher",
            "taskplat-dispatcher",
            "taskplat-dispatcher",
            ("taskplat.dispatcher.settings:DispatcherSettings",),
            (SECRET_NAMES - {"TASKPLAT_QUERY_DATABASE_URL"}) | LIBPQ_CREDENTIALS,
            devstack_module="taskplat.dispatcher",
            health_port_env="TASKPLAT_DISPATCHER_PORT",
            build_args=python_service_args("dispatcher", "TASKPLAT_DISPATCHER", 8080),
        ),
        ServiceSpec(
            "outbox-relay",
            "outbox-relay",
            "taskplat-outbox-relay",
            "taskplat-outbox-relay",
            "taskplat-outbox-relay",
            ("taskplat.outbox_relay.settings:RelaySettings",),
            # The attempt-token keys sign Lambda attempts' tokens, the capability keys untrusted
            # Lambda jobs' capability tokens.
            frozenset(
                {"DATABASE_URL", "TASKPLAT_ATTEMPT_TOKEN_KEYS", "TASKPLAT_CAPABILITY_TOKEN_KEYS"}
            )
            | LIBPQ_CREDENTIALS,
            uses_sqs=True,
            devstack_module="taskplat.outbox_relay",
            health_port_env="TASKPLAT_RELAY_OPS_PORT",
            build_args=python_service_args("outbox-relay", "TASKPLAT_RELAY_OPS", 9464),
        ),
        ServiceSpec(
            "scheduler",
            "scheduler",
            "taskplat-scheduler",
            "taskplat-scheduler",
            "taskplat-scheduler",
            ("taskplat.scheduler.settings:SchedulerSettings",),
            frozenset({"DATABASE_URL"}) | LIBPQ_CREDENTIALS,
            devstack_module="taskplat.scheduler",
            health_port_env="TASKPLAT_SCHEDULER_OPS_PORT",
            build_args=python_service_args("scheduler", "TASKPLAT_SCHEDULER_OPS", 9464),
        ),
        ServiceSpec(
            "reaper",
            "reaper",
            "taskplat-reaper",
            "taskplat-reaper",
            "taskplat-reaper",
            ("taskplat.reaper.settings:ReaperSettings",),
            frozenset({"DATABASE_URL"}) | LIBPQ_CREDENTIALS,
            devstack_module="taskplat.reaper",
            health_port_env="TASKPLAT_REAPER_OPS_PORT",
            build_args=python_service_args("reaper", "TASKPLAT_REAPER_OPS", 9464),
        ),
        ServiceSpec(
            "sink",
            "sink",
            "taskplat-sink",
            "taskplat-sink",
            "taskplat-sink",
            ("taskplat.sink.settings:SinkSettings",),
            frozenset({"DATABASE_URL"}) | LIBPQ_CREDENTIALS,
            uses_sqs=True,
            devstack_module="taskplat.sink",
            health_port_env="TASKPLAT_SINK_OPS_PORT",
            build_args=python_service_args("sink", "TASKPLAT_SINK_OPS", 9464),
        ),
        ServiceSpec(
            "credential-broker",
            "credential-broker",
            "taskplat-credential-broker",
            "taskplat-credential-broker",
            "taskplat-credential-broker",
            ("taskplat.credential_broker.settings:BrokerSettings",),
            frozenset({"TASKPLAT_CAPABILITY_TOKEN_KEYS"}),
            uses_sqs=True,  # boto3 (STS) with LocalStack's dummy credentials under compose
            devstack_module="taskplat.credential_broker",
            health_port_env="TASKPLAT_BROKER_PORT",
            build_args=python_service_args("credential-broker", "TASKPLAT_BROKER", 8090),
        ),
        ServiceSpec(
            "query-service",
            "query-service",
            "taskplat-query-service",
            "taskplat-query-service",
            "taskplat-query-service",
            ("taskplat.query_service.settings:QuerySettings",),
            frozenset({"TASKPLAT_CAPABILITY_TOKEN_KEYS", "TASKPLAT_QUERY_DATABASE_URL"}),
            uses_sqs=True,  # boto3 (STS, S3) with LocalStack's dummy credentials under compose
            devstack_module="taskplat.query_service",
            health_port_env="TASKPLAT_QUERY_PORT",
            build_args=python_service_args("query-service", "TASKPLAT_QUERY", 8092),
        ),
        ServiceSpec(
            "worker",
            "worker-wrapper",
            "taskplat-worker-base",
            "taskplat-worker-wrapper",
            "taskplat-worker-wrapper",
            ("taskplat.worker_wrapper.settings:WrapperSettings",),
            frozenset({"TASKPLAT_WORKER_TOKEN"}),
            uses_sqs=True,
            devstack_module="taskplat.worker_wrapper",
            health_port_env="TASKPLAT_WORKER_OPS_PORT",
        ),
        # The one-off migration task runs the dispatcher image's `taskplat-migrate`
        # (taskplat.common.db.migrate.main reads these three fragments).
        ServiceSpec(
            "migrate",
            "dispatcher",
            "taskplat-dispatcher",
            "taskplat-migrate",
            "taskplat-common",
            (
                "taskplat.common.settings:ServiceSettings",
                "taskplat.common.settings:DatabaseSettings",
                "taskplat.common.settings:MigrateSettings",
            ),
            frozenset({"DATABASE_URL"}),
            build_args=python_service_args("dispatcher", "TASKPLAT_DISPATCHER", 8080),
        ),
    )
}


# ------------------------------------------------------------------------- settings and packages


def settings_env_names(cls: type[BaseSettings]) -> set[str]:
    """Every environment variable name `cls` reads (upper case; the classes are
    case-insensitive)."""
    names: set[str] = set()
    for name in cls.model_fields:
        names |= settings_env_names_of_field(cls, name)
    return names


def settings_env_names_of_field(cls: type[BaseSettings], name: str) -> set[str]:
    """The variables one field reads: its validation aliases, else env_prefix + field name."""
    alias = cls.model_fields[name].validation_alias
    if alias is None:
        return {f"{cls.model_config.get('env_prefix', '')}{name}".upper()}
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
    names: set[str] = set()
    for choice in choices:
        if isinstance(choice, str):
            names.add(choice.upper())
        elif isinstance(choice, AliasPath) and isinstance(choice.path[0], str):
            names.add(choice.path[0].upper())
    return names


def pyproject(package: str) -> dict[str, Any]:
    for path in [*REPO.glob("services/*/pyproject.toml"), *REPO.glob("libs/*/pyproject.toml")]:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        if data["project"]["name"] == package:
            return data
    raise LookupError(f"no workspace package named {package}")


def service_package(service_dir: str) -> str:
    path = REPO / "services" / service_dir / "pyproject.toml"
    return str(tomllib.loads(path.read_text(encoding="utf-8"))["project"]["name"])


def console_script_target(package: str, script: str) -> str:
    scripts: dict[str, str] = pyproject(package)["project"].get("scripts", {})
    if script not in scripts:
        raise LookupError(f"{package} declares no console script {script} (it has {scripts})")
    return scripts[script]


def resolve_target(target: str) -> object:
    module, _, attr = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def lock_closure(package: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Names of every package `uv sync --package <package>` installs, from uv.lock."""
    lock = tomllib.loads((REPO / "uv.lock").read_text(encoding="utf-8"))
    by_name = {entry["name"]: entry for entry in lock["package"]}
    visited: set[tuple[str, tuple[str, ...]]] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(package, extras)]
    while todo:
        key = todo.pop()
        if key in visited:
            continue
        visited.add(key)
        name, wanted = key
        entry = by_name[name]
        deps = list(entry.get("dependencies", []))
        for extra in wanted:
            deps += entry.get("optional-dependencies", {}).get(extra, [])
        todo.extend((dep["name"], tuple(dep.get("extra", ()))) for dep in deps)
    return {name for name, _ in visited}


# ------------------------------------------------------------------------- CloudFormation


class _TemplateLoader(yaml.SafeLoader):
    """PyYAML with CloudFormation's short tags (`!Ref x` -> {"Ref": x}, `!Sub s` ->
    {"Fn::Sub": s}, `!GetAtt A.B` -> {"Fn::GetAtt": ["A", "B"]}): the long form cfn-lint sees.
    (Importing cfn-lint itself costs seconds; it runs in its own process in test_cfn_lint.)"""


def _intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref" or suffix == "Condition":
        return {suffix: value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_TemplateLoader.add_multi_constructor("!", _intrinsic)


def load_template(path: Path) -> dict[str, Any]:
    template = yaml.load(path.read_text(encoding="utf-8"), Loader=_TemplateLoader)
    assert isinstance(template, dict)
    return template


def templates() -> dict[str, dict[str, Any]]:
    return {path.name: load_template(path) for path in sorted(TEMPLATE_DIR.glob("*.yaml"))}


@dataclass(frozen=True)
class Container:
    template: str
    task_definition: str  # logical id
    properties: Mapping[str, Any]  # of the task definition
    definition: Mapping[str, Any]  # the container definition

    @property
    def name(self) -> str:
        return str(self.definition["Name"])

    @property
    def environment(self) -> dict[str, Any]:
        """Name -> Value of every variable, those an `Fn::If` may add included."""
        return {
            branch["Name"]: branch["Value"]
            for item in self.definition.get("Environment", [])
            for branch in _unconditional(item)
        }

    @property
    def secrets(self) -> dict[str, Any]:
        """Name -> ValueFrom of every secret, those an `Fn::If` may add included."""
        return {
            branch["Name"]: branch["ValueFrom"]
            for item in self.definition.get("Secrets", [])
            for branch in _unconditional(item)
        }


def all_containers(all_templates: Mapping[str, Mapping[str, Any]]) -> list[Container]:
    """Every container of every task definition, sidecars and upcoming services included."""
    found = []
    for template_name, template in all_templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] != "AWS::ECS::TaskDefinition":
                continue
            for definition in resource["Properties"]["ContainerDefinitions"]:
                found.append(
                    Container(template_name, logical_id, resource["Properties"], definition)
                )
    return found


def containers(all_templates: Mapping[str, Mapping[str, Any]]) -> list[Container]:
    """The service containers (see the module docstring)."""
    return [
        container
        for container in all_containers(all_templates)
        if container.name != COLLECTOR and not upcoming_and_absent(container.name)
    ]


def collectors(all_templates: Mapping[str, Mapping[str, Any]]) -> list[Container]:
    return [c for c in all_containers(all_templates) if c.name == COLLECTOR]


def resources_of_type(template: Mapping[str, Any], kind: str) -> dict[str, Mapping[str, Any]]:
    return {
        logical_id: resource
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == kind
    }


def role_statements(template: Mapping[str, Any], role_ref: Any) -> list[Mapping[str, Any]]:
    """The Allow statements of the inline policies of the role `role_ref` (a GetAtt .Arn)."""
    logical_id = role_ref["Fn::GetAtt"][0]
    role = template["Resources"][logical_id]
    statements: list[Mapping[str, Any]] = []
    for policy in role["Properties"].get("Policies", []):
        for statement in policy["PolicyDocument"]["Statement"]:
            statements.extend(_unconditional(statement))
    assert "ManagedPolicyArns" not in role["Properties"], f"{logical_id} has managed policies"
    return statements


def _unconditional(statement: Any) -> Iterator[Mapping[str, Any]]:
    """A statement, or both branches of an `Fn::If` (a condition may turn on either)."""
    if isinstance(statement, Mapping) and "Fn::If" in statement:
        for branch in statement["Fn::If"][1:]:
            if not (isinstance(branch, Mapping) and branch.get("Ref") == "AWS::NoValue"):
                yield from _unconditional(branch)
    else:
        yield statement


def secret_resource(value_from: Any) -> Any:
    """The secret a `ValueFrom` (or an IAM statement's resource) names, as `{"Ref": P}`: also
    for one JSON key of it (`!Sub "${P}:username::"`) and for `!Sub "${P}"`."""
    if isinstance(value_from, Mapping) and "Fn::Sub" in value_from:
        match = re.fullmatch(r"\$\{(\w+)\}(:\w+::)?", str(value_from["Fn::Sub"]))
        if match:
            return {"Ref": match.group(1)}
    return value_from


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def image_repository(image: Any) -> str | None:
    """`taskplat-dispatcher` for `!Sub ${ImageRegistry}/taskplat-dispatcher:${ImageTag}`; None
    for an image given whole by a parameter (the worker pool's product image)."""
    if isinstance(image, Mapping) and "Fn::If" in image:
        branches = {image_repository(branch) for branch in image["Fn::If"][1:]}
        assert len(branches) == 1, f"the branches of {image!r} run different images"
        return branches.pop()
    if isinstance(image, Mapping) and "Fn::Sub" in image:
        pattern = r"\$\{ImageRegistry\}/([a-z0-9-]+):\$\{(?:Migrate)?ImageTag\}"
        match = re.fullmatch(pattern, image["Fn::Sub"])
        if match:
            return match.group(1)
        raise AssertionError(f"unexpected image expression {image['Fn::Sub']}")
    if isinstance(image, Mapping) and "Ref" in image:
        return None
    raise AssertionError(f"unexpected image {image!r}")


# ------------------------------------------------------------------------- Dockerfiles


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for part in shlex.split(args):
                name, _, value = part.partition("=")
                values[name] = value
        return values


@dataclass
class Dockerfile:
    path: Path
    args: dict[str, str]  # ARGs before the first FROM, with their defaults
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise LookupError(f"{self.path} has no stage {name}")

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: self.args.get(m.group(1), m.group(0)), text)

    def cmd(self) -> list[str]:
        cmds = self.final.all("CMD")
        assert len(cmds) == 1, f"{self.path}: one CMD in the final stage, found {len(cmds)}"
        value = json.loads(cmds[0])
        assert isinstance(value, list), f"{self.path}: CMD must be exec form (a JSON list)"
        return [str(item) for item in value]

    def command(self) -> list[str]:
        """CMD with a program the final stage links to a virtualenv script resolved to that
        script (`ln -s /app/.venv/bin/<script> /usr/local/bin/<program>`)."""
        cmd = self.cmd()
        for run in self.final.all("RUN"):
            for script, program in re.findall(
                r"ln -s /app/\.venv/bin/(\S+) /usr/local/bin/(\S+)", run
            ):
                if program == cmd[0]:
                    return [script, *cmd[1:]]
        return cmd


def parse_dockerfile(path: Path, build_args: Mapping[str, str] | None = None) -> Dockerfile:
    """The instructions of `path`, with `${ARG}` replaced by `build_args` (else the ARG's default)
    as a build with those `--build-arg`s does."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        rest = " ".join(rest.split())
        if instruction == "FROM":
            base, _, name = rest.partition(" AS ")
            stages.append(Stage(base.strip(), name.strip() or None))
        elif not stages:
            assert instruction == "ARG", f"{path}: {instruction} before the first FROM"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append((instruction, rest))
    values = {**args, **(build_args or {})}
    for stage in stages:
        stage.instructions = [
            (name, _substitute(rest, values)) for name, rest in stage.instructions
        ]
    return Dockerfile(path, args, stages)


def _substitute(text: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1)) or m.group(0), text)


# ------------------------------------------------------------------------- compose

_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _interpolate(value: Any) -> Any:
    """Resolve `${NAME:-default}` to its default, as compose does with NAME unset."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [_interpolate(item) for item in value]
    if isinstance(value, dict):
        return {key: _interpolate(item) for key, item in value.items()}
    return value


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return dict(_interpolate(data))


def compose_environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(name): str(value) for name, value in env.items()}
