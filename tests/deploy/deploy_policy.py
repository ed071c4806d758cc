"""Policy-as-code for deploy/cloudformation: rules every template must keep, beyond cfn-lint.

Run by `make deploy-check` (`python tests/deploy/deploy_policy.py`, exit 1 with one line per
finding) and by tests/deploy/test_policy.py, which also proves each rule catches a broken copy.

Why Python rather than cfn-guard: cfn-guard ships as a Rust binary that neither PyPI, npm nor
Debian provides, and the project installs everything from its own files; checkov's generic
checks cannot say this project's invariants (a worker pulls only its repository, every service
task has its collector). The rules read the templates as CloudFormation sees them (the long form
of the short tags, via deploy_model) and treat both branches of an `Fn::If` as possible.

Invariants: a rule is a function `(template_name, template) -> Iterator[Finding]`; `RULES` lists
them all; `check()` runs every rule on every template and returns the findings, sorted.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import deploy_model

Template = Mapping[str, Any]

# Actions that have no resource-level permissions, so their statements must name "*".
STAR_RESOURCE_ACTIONS = frozenset(
    {
        "ecr:GetAuthorizationToken",
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "xray:GetSamplingRules",
        "xray:GetSamplingTargets",
        # A function in a VPC: Lambda lists the network interfaces it made for it.
        "ec2:DescribeNetworkInterfaces",
    }
)
# Roles a principal other than ECS tasks of this account may assume: logical id -> the role
# resource that may assume it.
ROLE_TRUSTS_ROLE = {
    "DataAccessRole": "CredentialBrokerTaskRole",
    "QueryReadRole": "QueryServiceTaskRole",
}
SECRET_LIKE = re.compile(r"(TOKEN|PASSWORD|SECRET|API_KEYS?|DATABASE_URL|CREDENTIALS?)$")
TLS_POLICY = re.compile(r"^ELBSecurityPolicy-TLS13-1-[23]-")
# Alarms that drive scaling rather than people.
SCALING_ALARMS = frozenset({"WorkerWakeAlarm"})


class Finding(NamedTuple):
    template: str
    resource: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.template}: {self.resource}: [{self.rule}] {self.message}"


Rule = Callable[[str, Template], Iterator[Finding]]


def _branches(value: Any) -> Iterator[Any]:
    """`value`, or every non-NoValue branch of an `Fn::If` (recursively)."""
    if isinstance(value, Mapping) and "Fn::If" in value:
        for branch in value["Fn::If"][1:]:
            if not (isinstance(branch, Mapping) and branch.get("Ref") == "AWS::NoValue"):
                yield from _branches(branch)
    else:
        yield value


def _statements(document: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for statement in deploy_model.as_list(document["Statement"]):
        yield from _branches(statement)


def _policy_documents(template: Template) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::IAM::Role":
            for policy in resource["Properties"].get("Policies", []):
                yield logical_id, policy["PolicyDocument"]
        elif resource["Type"] in {"AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"}:
            yield logical_id, resource["Properties"]["PolicyDocument"]


def no_wildcard_actions(name: str, template: Template) -> Iterator[Finding]:
    for logical_id, document in _policy_documents(template):
        for statement in _statements(document):
            for action in deploy_model.as_list(statement["Action"]):
                if "*" in str(action):
                    yield Finding(name, logical_id, "no-wildcard-actions", f"grants {action}")


def star_resource_only_where_required(name: str, template: Template) -> Iterator[Finding]:
    for logical_id, document in _policy_documents(template):
        for statement in _statements(document):
            if "*" in deploy_model.as_list(statement["Resource"]):
                extra = set(deploy_model.as_list(statement["Action"])) - STAR_RESOURCE_ACTIONS
                if extra:
                    yield Finding(
                        name, logical_id, "star-resource", f"{sorted(extra)} on Resource '*'"
                    )


def _function_roles(template: Template) -> set[str]:
    """Logical ids of the roles that are a Lambda function's execution role."""
    roles: set[str] = set()
    for function in deploy_model.resources_of_type(template, "AWS::Lambda::Function").values():
        role = function["Properties"].get("Role")
        if isinstance(role, dict) and "Fn::GetAtt" in role:
            roles.add(role["Fn::GetAtt"][0])
    return roles


def roles_trust_only_their_tasks(name: str, template: Template) -> Iterator[Finding]:
    """A role trusts ECS tasks of this account, or, for a function's execution role, Lambda in
    this account; the data role trusts the credential broker's role only, the query read role the
    query service's role only."""
    function_roles = _function_roles(template)
    for logical_id, role in deploy_model.resources_of_type(template, "AWS::IAM::Role").items():
        for statement in _statements(role["Properties"]["AssumeRolePolicyDocument"]):
            principal = statement.get("Principal", {})
            if logical_id in ROLE_TRUSTS_ROLE:
                expected = {"AWS": {"Fn::GetAtt": [ROLE_TRUSTS_ROLE[logical_id], "Arn"]}}
                if principal != expected:
                    yield Finding(name, logical_id, "trust", f"trusts {principal}")
                continue
            account = {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
            service = "ecs-tasks.amazonaws.com"
            if logical_id in function_roles:
                service = "lambda.amazonaws.com"
            if principal != {"Service": service} or statement.get("Condition") != account:
                yield Finding(
                    name, logical_id, "trust", f"must trust {service} of this account only"
                )


def images_come_from_named_repositories(name: str, template: Template) -> Iterator[Finding]:
    """An execution role pulls from named repositories (`taskplat-*` or one worker repository),
    never from every repository of the account."""
    for logical_id, document in _policy_documents(template):
        for statement in _statements(document):
            if "ecr:BatchGetImage" not in deploy_model.as_list(statement["Action"]):
                continue
            for resource in deploy_model.as_list(statement["Resource"]):
                if str(resource).rstrip("'}\"").endswith("repository/*"):
                    yield Finding(name, logical_id, "ecr-scope", "pulls from any repository")


def queues_are_encrypted(name: str, template: Template) -> Iterator[Finding]:
    for logical_id, queue in deploy_model.resources_of_type(template, "AWS::SQS::Queue").items():
        props = queue["Properties"]
        if props.get("SqsManagedSseEnabled") is not True and "KmsMasterKeyId" not in props:
            yield Finding(name, logical_id, "queue-encryption", "not encrypted at rest")


def log_groups_expire(name: str, template: Template) -> Iterator[Finding]:
    for logical_id, group in deploy_model.resources_of_type(
        template, "AWS::Logs::LogGroup"
    ).items():
        if "RetentionInDays" not in group["Properties"]:
            yield Finding(name, logical_id, "log-retention", "keeps logs forever")


def services_are_private_and_roll_back(name: str, template: Template) -> Iterator[Finding]:
    for logical_id, service in deploy_model.resources_of_type(
        template, "AWS::ECS::Service"
    ).items():
        props = service["Properties"]
        network = props["NetworkConfiguration"]["AwsvpcConfiguration"]
        if network.get("AssignPublicIp") != "DISABLED":
            yield Finding(name, logical_id, "private-service", "tasks get a public IP")
        breaker = props.get("DeploymentConfiguration", {}).get("DeploymentCircuitBreaker")
        if breaker != {"Enable": True, "Rollback": True}:
            yield Finding(name, logical_id, "circuit-breaker", "no rollback on failed deploys")


def service_tasks_have_a_collector(name: str, template: Template) -> Iterator[Finding]:
    resources = template["Resources"]
    for logical_id, service in deploy_model.resources_of_type(
        template, "AWS::ECS::Service"
    ).items():
        task = resources[service["Properties"]["TaskDefinition"]["Ref"]]
        names = [c["Name"] for c in task["Properties"]["ContainerDefinitions"]]
        if names.count(deploy_model.COLLECTOR) != 1:
            yield Finding(name, logical_id, "collector", f"task containers {names}")


def no_secrets_in_plain_environment(name: str, template: Template) -> Iterator[Finding]:
    for container in deploy_model.all_containers({name: template}):
        for variable in container.environment:
            if SECRET_LIKE.search(variable):
                yield Finding(
                    name,
                    container.task_definition,
                    "plain-secret",
                    f"{container.name} sets {variable} in Environment, not Secrets",
                )


def containers_are_unprivileged(name: str, template: Template) -> Iterator[Finding]:
    for container in deploy_model.all_containers({name: template}):
        if container.definition.get("Privileged") is True:
            yield Finding(name, container.task_definition, "privileged", container.name)
        if container.definition.get("ReadonlyRootFilesystem") is not True and (
            container.name == deploy_model.COLLECTOR
        ):
            yield Finding(name, container.task_definition, "read-only-root", container.name)


def load_balancers_are_strict(name: str, template: Template) -> Iterator[Finding]:
    kind = "AWS::ElasticLoadBalancingV2::LoadBalancer"
    for logical_id, lb in deploy_model.resources_of_type(template, kind).items():
        attributes = {
            a["Key"]: a["Value"] for a in lb["Properties"].get("LoadBalancerAttributes", [])
        }
        if attributes.get("routing.http.drop_invalid_header_fields.enabled") != "true":
            yield Finding(name, logical_id, "alb-headers", "keeps invalid header fields")
    kind = "AWS::ElasticLoadBalancingV2::Listener"
    for logical_id, listener in deploy_model.resources_of_type(template, kind).items():
        props = listener["Properties"]
        protocols = set(_branches(props["Protocol"]))
        if "HTTPS" in protocols:
            policies = {p for p in _branches(props.get("SslPolicy")) if p is not None}
            if not policies or not all(TLS_POLICY.match(str(p)) for p in policies):
                yield Finding(name, logical_id, "tls-policy", f"SslPolicy {policies}")


def worker_api_is_encrypted_by_default(name: str, template: Template) -> Iterator[Finding]:
    listener = template["Resources"].get("InternalListener")
    if listener is None:
        return
    if listener["Properties"]["Protocol"] != {"Fn::If": ["HasInternalTls", "HTTPS", "HTTP"]}:
        yield Finding(name, "InternalListener", "worker-api-tls", "not HTTPS with a certificate")
    rule = template.get("Rules", {}).get("WorkerApiIsEncrypted", {})
    if rule.get("RuleCondition") != {"Fn::Equals": [{"Ref": "AllowPlaintextWorkerApi"}, "false"]}:
        yield Finding(name, "Rules", "worker-api-tls", "plain HTTP must be an explicit opt-in")
    elif template["Parameters"]["AllowPlaintextWorkerApi"].get("Default") != "false":
        yield Finding(name, "AllowPlaintextWorkerApi", "worker-api-tls", "must default to false")


def alarms_notify(name: str, template: Template) -> Iterator[Finding]:
    expected = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    for logical_id, alarm in deploy_model.resources_of_type(
        template, "AWS::CloudWatch::Alarm"
    ).items():
        if logical_id in SCALING_ALARMS:
            continue
        props = alarm["Properties"]
        if props.get("AlarmActions") != expected or props.get("OKActions") != expected:
            yield Finding(name, logical_id, "alarm-actions", "does not notify AlarmTopicArn")


def lambda_retries_are_off(name: str, template: Template) -> Iterator[Finding]:
    """Taskplat owns attempts: every function has an EventInvokeConfig with no Lambda retry."""
    configs = deploy_model.resources_of_type(template, "AWS::Lambda::EventInvokeConfig")
    configured = {
        str(config["Properties"].get("FunctionName", {}).get("Ref"))
        for config in configs.values()
        if config["Properties"].get("MaximumRetryAttempts") == 0
    }
    for logical_id in deploy_model.resources_of_type(template, "AWS::Lambda::Function"):
        if logical_id not in configured:
            yield Finding(
                name, logical_id, "lambda-retries", "needs EventInvokeConfig MaximumRetryAttempts 0"
            )


RULES: tuple[Rule, ...] = (
    no_wildcard_actions,
    star_resource_only_where_required,
    roles_trust_only_their_tasks,
    images_come_from_named_repositories,
    queues_are_encrypted,
    log_groups_expire,
    services_are_private_and_roll_back,
    service_tasks_have_a_collector,
    no_secrets_in_plain_environment,
    containers_are_unprivileged,
    load_balancers_are_strict,
    worker_api_is_encrypted_by_default,
    alarms_notify,
    lambda_retries_are_off,
)


def check(templates: Mapping[str, Template]) -> list[Finding]:
    findings = [
        finding
        for name, template in templates.items()
        for rule in RULES
        for finding in rule(name, template)
    ]
    return sorted(findings)


def main() -> int:
    templates = deploy_model.templates()
    findings = check(templates)
    for finding in findings:
        print(finding)
    print(
        f"policy check: {len(RULES)} rules, {len(templates)} templates, {len(findings)} findings",
        file=sys.stderr,
    )
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
