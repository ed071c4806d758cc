"""The ECS task definitions of deploy/cloudformation, resolved for given stack parameters.

`task_containers(template, parameters, imports)` evaluates a template the way CloudFormation
would for those parameters (`Ref`, `Fn::Sub`, `Fn::If` on the template's conditions,
`Fn::FindInMap`, `Fn::ImportValue` from `imports`, `Fn::GetAtt` as a placeholder ARN) and returns
each container of each `AWS::ECS::TaskDefinition` as a `ContainerDef`: what `make up-images`
starts with podman.

Invariants: nothing is invented: a container's command, environment, secrets (names and the
`ValueFrom` they name), user, ports, mount points, health check, read-only root and stop timeout
are the template's; a value the template leaves out stays `None` or empty. A reference that cannot
be resolved (an unknown parameter, an import not given) raises `TemplateError` naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    """A template that cannot be resolved with the parameters given."""


class _Loader(yaml.SafeLoader):
    """PyYAML with CloudFormation's short tags read as their long form (`!Ref x` ->
    {"Ref": x}, `!GetAtt A.B` -> {"Fn::GetAtt": ["A", "B"]})."""


def _intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)
        value = loader.construct_mapping(node, deep=True)
    if suffix in ("Ref", "Condition"):
        return {suffix: value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_Loader.add_multi_constructor("!", _intrinsic)


def load_template(path: Path) -> dict[str, Any]:
    document = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    if not isinstance(document, dict):
        raise TemplateError(f"{path} is not a CloudFormation template")
    return document


_NO_VALUE = object()
PSEUDO = {
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "000000000000",
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
}


class Resolver:
    """Evaluates the intrinsic functions of one template for one set of parameters."""

    def __init__(
        self,
        template: Mapping[str, Any],
        parameters: Mapping[str, str],
        imports: Mapping[str, str] | None = None,
        stack_name: str = "taskplat",
        region: str = PSEUDO["AWS::Region"],
    ) -> None:
        self.template = template
        self.values: dict[str, Any] = {
            **PSEUDO,
            "AWS::StackName": stack_name,
            "AWS::Region": region,
        }
        for name, spec in template.get("Parameters", {}).items():
            if name in parameters:
                self.values[name] = parameters[name]
            elif "Default" in spec:
                self.values[name] = spec["Default"]
        unknown = set(parameters) - set(template.get("Parameters", {}))
        if unknown:
            raise TemplateError(f"the template has no parameters {sorted(unknown)}")
        self.imports = dict(imports or {})
        self._conditions: dict[str, bool] = {}

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            spec = self.template.get("Conditions", {}).get(name)
            if spec is None:
                raise TemplateError(f"no condition {name}")
            self._conditions[name] = bool(self._truth(spec))
        return self._conditions[name]

    def _truth(self, spec: Any) -> bool:
        if isinstance(spec, Mapping):
            if "Condition" in spec:
                return self.condition(spec["Condition"])
            if "Fn::Equals" in spec:
                left, right = (self.resolve(v) for v in spec["Fn::Equals"])
                return str(left) == str(right)
            if "Fn::Not" in spec:
                return not self._truth(spec["Fn::Not"][0])
            if "Fn::And" in spec:
                return all(self._truth(item) for item in spec["Fn::And"])
            if "Fn::Or" in spec:
                return any(self._truth(item) for item in spec["Fn::Or"])
        raise TemplateError(f"unsupported condition {spec!r}")

    def resolve(self, value: Any) -> Any:
        """`value` with every intrinsic function evaluated; `AWS::NoValue` items dropped."""
        result = self._resolve(value)
        return None if result is _NO_VALUE else result

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            items = [self._resolve(item) for item in value]
            return [item for item in items if item is not _NO_VALUE]
        if not isinstance(value, Mapping):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self._ref(arg)
            if key == "Fn::If":
                name, then, otherwise = arg
                return self._resolve(then if self.condition(name) else otherwise)
            if key == "Fn::Sub":
                return self._sub(arg)
            if key == "Fn::GetAtt":
                return self._get_att(*arg)
            if key == "Fn::ImportValue":
                name = str(self._resolve(arg))
                if name not in self.imports:
                    raise TemplateError(f"no value given for the import {name}")
                return self.imports[name]
            if key == "Fn::FindInMap":
                mapping, first, second = (self._resolve(part) for part in arg)
                return self.template["Mappings"][mapping][str(first)][str(second)]
            if key == "Fn::Join":
                separator, parts = arg
                return str(separator).join(str(part) for part in self._resolve(parts))
            if key == "Fn::Select":
                index, choices = arg
                return self._resolve(choices)[int(self._resolve(index))]
        resolved = {key: self._resolve(item) for key, item in value.items()}
        return {key: item for key, item in resolved.items() if item is not _NO_VALUE}

    def _get_att(self, logical_id: str, attribute: str) -> str:
        """A placeholder of the shape AWS gives (an IAM role's ARN names the role)."""
        resource = self.template.get("Resources", {}).get(logical_id)
        if resource is None:
            raise TemplateError(f"no resource {logical_id}")
        if resource.get("Type") == "AWS::IAM::Role" and attribute == "Arn":
            return f"arn:aws:iam::{PSEUDO['AWS::AccountId']}:role/{logical_id}"
        return f"local-{logical_id}-{attribute}"

    def _ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return _NO_VALUE
        if name in self.values:
            value = self.values[name]
            return ",".join(value) if isinstance(value, list) else value
        if name in self.template.get("Resources", {}):
            return f"local-{name}"
        raise TemplateError(f"no value for the parameter {name}")

    def _sub(self, arg: Any) -> str:
        text, local = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])

        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in local:
                return str(self._resolve(local[name]))
            if "." in name:
                return str(self._resolve({"Fn::GetAtt": name.split(".", 1)}))
            return str(self._ref(name))

        return re.sub(r"\$\{([\w:.]+)\}", one, text)


@dataclass(frozen=True)
class HealthCheck:
    command: list[str]  # without the leading CMD / CMD-SHELL
    shell: bool
    interval: int = 30
    timeout: int = 5
    retries: int = 3
    start_period: int = 0


@dataclass(frozen=True)
class ContainerDef:
    """One container of a task definition, as ECS would run it."""

    task_definition: str
    name: str
    image: str
    command: list[str] | None
    environment: dict[str, str]
    secrets: dict[str, str]  # variable -> the ValueFrom it is read from
    user: str | None
    read_only: bool
    mounts: list[tuple[str, str]]  # (volume name, container path)
    volumes: list[str]
    ports: list[int]
    health: HealthCheck | None
    stop_timeout: int | None
    init: bool
    essential: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def _health(spec: Mapping[str, Any] | None) -> HealthCheck | None:
    if not spec:
        return None
    command = [str(part) for part in spec["Command"]]
    kind, rest = command[0], command[1:]
    if kind not in ("CMD", "CMD-SHELL"):
        raise TemplateError(f"a health check command starts with CMD or CMD-SHELL: {command}")
    return HealthCheck(
        command=rest,
        shell=kind == "CMD-SHELL",
        interval=int(spec.get("Interval", 30)),
        timeout=int(spec.get("Timeout", 5)),
        retries=int(spec.get("Retries", 3)),
        start_period=int(spec.get("StartPeriod", 0)),
    )


def task_containers(resolver: Resolver) -> list[ContainerDef]:
    """Every container of every task definition of the resolver's template."""
    found: list[ContainerDef] = []
    for logical_id, resource in resolver.template.get("Resources", {}).items():
        if resource.get("Type") != "AWS::ECS::TaskDefinition":
            continue
        if "Condition" in resource and not resolver.condition(resource["Condition"]):
            continue
        properties = resolver.resolve(resource["Properties"])
        volumes = [str(volume["Name"]) for volume in properties.get("Volumes", [])]
        for definition in properties["ContainerDefinitions"]:
            found.append(_container(logical_id, definition, volumes))
    return found


def _container(logical_id: str, d: Mapping[str, Any], volumes: list[str]) -> ContainerDef:
    return ContainerDef(
        task_definition=logical_id,
        name=str(d["Name"]),
        image=str(d["Image"]),
        command=[str(part) for part in d["Command"]] if "Command" in d else None,
        environment={str(e["Name"]): str(e["Value"]) for e in d.get("Environment", [])},
        secrets={str(s["Name"]): str(s["ValueFrom"]) for s in d.get("Secrets", [])},
        user=str(d["User"]) if "User" in d else None,
        read_only=bool(d.get("ReadonlyRootFilesystem", False)),
        mounts=[
            (str(m["SourceVolume"]), str(m["ContainerPath"])) for m in d.get("MountPoints", [])
        ],
        volumes=volumes,
        ports=[int(p["ContainerPort"]) for p in d.get("PortMappings", [])],
        health=_health(d.get("HealthCheck")),
        stop_timeout=int(d["StopTimeout"]) if "StopTimeout" in d else None,
        init=bool(d.get("LinuxParameters", {}).get("InitProcessEnabled", False)),
        essential=bool(d.get("Essential", True)),
    )
