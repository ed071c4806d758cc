"""Every ECS task definition runs its service's real entry point with settings the service reads.

Checked for each container of deploy/cloudformation: the command is a console script of the
service's package that resolves to a callable (the same `__main__.main` the local stack runs), and
the image's Dockerfile CMD is that command; every environment variable and secret is a name the
service's settings classes read, and together they make settings that validate; secrets reach only
the services that need them, and each execution role reads exactly its task definitions' secrets.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping
from typing import Any

import deploy_model
import pytest
from deploy_model import SPECS, Container
from pydantic import SecretStr

from taskplat.common.tokens.keys import TokenKeySettings, private_key_pem

# Values that stand in for what CloudFormation resolves at deploy time.
SIGNING_KEY = private_key_pem(b"\x01" * 32)
PUBLIC_KEY = TokenKeySettings(keys={"k1": SecretStr(SIGNING_KEY)}).public().keys["k1"]
SAMPLE_SECRETS = {
    "DATABASE_URL": "postgresql://taskplat@db.example.internal:5432/taskplat",
    "TASKPLAT_WORKER_TOKEN": "w" * 32,
    "TASKPLAT_API_KEYS": f"{'a' * 20},{'b' * 20}",
    "PGUSER": "taskplat_app",
    "PGPASSWORD": "p" * 32,
    "TASKPLAT_CAPABILITY_TOKEN_KEYS": json.dumps({"k1": SIGNING_KEY}),
    "TASKPLAT_ATTEMPT_TOKEN_KEYS": json.dumps({"k1": private_key_pem(b"\x02" * 32)}),
    "TASKPLAT_QUERY_DATABASE_URL": "postgresql://taskplat_query_app:q@db.example.internal/taskplat",
}
# The same variable from another secret: the verifiers' public keys.
SAMPLE_SECRETS_BY_ARN = {
    "CapabilityTokenPublicKeysSecretArn": json.dumps({"k1": PUBLIC_KEY.get_secret_value()})
}
SAMPLE_PSEUDO = {"AWS::Region": "eu-west-1"}
# Parameters whose default is empty, for the settings an `Fn::If` gives only when they are set.
SAMPLE_PARAMETERS = {"DataBucketName": "taskplat-data-example"}
EXPORTING_TEMPLATE = {"PlatformStackName": "platform.yaml", "QueueStackName": "task-queue.yaml"}


def _by_name(containers: list[Container]) -> dict[str, Container]:
    names = [container.name for container in containers]
    assert len(names) == len(set(names)), f"container names are not unique: {names}"
    return {container.name: container for container in containers}


def test_every_service_has_exactly_one_container(ecs_containers: list[Container]) -> None:
    assert set(_by_name(ecs_containers)) == set(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_command_is_the_services_entry_point(name: str, ecs_containers: list[Container]) -> None:
    spec, container = SPECS[name], _by_name(ecs_containers)[name]
    command = [str(part) for part in container.definition["Command"]]
    assert command == [spec.script], f"{name}: command {command}, expected [{spec.script!r}]"
    target = deploy_model.console_script_target(spec.script_package, spec.script)
    assert callable(deploy_model.resolve_target(target)), f"{spec.script} -> {target}"
    if spec.devstack_module is not None:
        # The local stack runs `python -m <module>`: the same function must be behind both.
        assert target == f"{spec.devstack_module}.__main__:main", target
        devstack = importlib.import_module("taskplat.devstack.stack.stack")
        data = importlib.import_module("taskplat.devstack.stack.data_services")
        run_by_make_up = {*devstack.SERVICES.values(), *data.DATA_SERVICES.values()}
        assert spec.devstack_module in {*run_by_make_up, devstack.WORKER_MODULE}
    assert "EntryPoint" not in container.definition, f"{name}: the image's entry point must stay"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_image_is_built_by_the_services_dockerfile(
    name: str, ecs_containers: list[Container]
) -> None:
    spec, container = SPECS[name], _by_name(ecs_containers)[name]
    repository = deploy_model.image_repository(container.definition["Image"])
    if name == "worker":
        # A product team's image FROM taskplat-worker-base: it inherits the base image's CMD.
        assert repository is None
    else:
        assert repository == spec.image, f"{name} runs {repository}, expected {spec.image}"
    dockerfile = spec.parsed_dockerfile()
    if spec.script == dockerfile.command()[0]:
        assert dockerfile.command() == [str(part) for part in container.definition["Command"]]
    else:
        # Another script of the same image (the migration task): its package and the database
        # driver it needs must be installed there.
        installed = deploy_model.lock_closure(deploy_model.service_package(spec.service_dir))
        assert {spec.script_package, "psycopg"} <= installed, sorted(installed)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_variable_is_one_the_service_reads(
    name: str, ecs_containers: list[Container]
) -> None:
    spec, container = SPECS[name], _by_name(ecs_containers)[name]
    accepted = spec.accepted_env()
    if "DATABASE_URL" in spec.secrets:
        accepted |= deploy_model.LIBPQ_CREDENTIALS
    if name == "worker":
        accepted |= deploy_model.OPERATOR_PASSTHROUGH_ENV
    names = [*container.environment, *container.secrets]
    assert len(names) == len(set(names)), f"{name}: a variable is set twice: {names}"
    unknown = {n for n in names if n.upper() not in accepted}
    assert not unknown, (
        f"{name}: {sorted(unknown)} are read by no settings class of {spec.settings}"
    )


@pytest.mark.parametrize("name", sorted(SPECS))
def test_secrets_reach_only_the_services_that_need_them(
    name: str, ecs_containers: list[Container]
) -> None:
    spec, container = SPECS[name], _by_name(ecs_containers)[name]
    assert set(container.secrets) == spec.secrets, f"{name}: secrets {sorted(container.secrets)}"
    leaked = deploy_model.SECRET_NAMES & set(container.environment)
    assert not leaked, f"{name}: {sorted(leaked)} must come from Secrets Manager, not Environment"
    for value in container.secrets.values():
        value = deploy_model.secret_resource(value)
        assert isinstance(value, Mapping) and ("Ref" in value or "Fn::ImportValue" in value)


def _resolve(value: Any, template: Mapping[str, Any], all_templates: Mapping[str, Any]) -> str:
    if isinstance(value, str | int | float):
        return str(value)
    if "Ref" in value:
        ref = value["Ref"]
        if ref in SAMPLE_PSEUDO:
            return SAMPLE_PSEUDO[ref]
        if ref in SAMPLE_PARAMETERS:
            return SAMPLE_PARAMETERS[ref]
        return str(template["Parameters"][ref]["Default"])
    if "Fn::GetAtt" in value and value["Fn::GetAtt"][1] == "Arn":  # a role of the template
        return f"arn:aws:iam::123456789012:role/{value['Fn::GetAtt'][0]}"
    if "Fn::ImportValue" in value:
        stack_param, export = value["Fn::ImportValue"]["Fn::Sub"].split("}-", 1)
        exporter = all_templates[EXPORTING_TEMPLATE[stack_param.lstrip("${")]]
        for output in exporter["Outputs"].values():
            if (
                output.get("Export", {}).get("Name", {}).get("Fn::Sub")
                == f"${{AWS::StackName}}-{export}"
            ):
                sample = output["Value"]
                if isinstance(sample, Mapping) and "Fn::If" in sample:
                    sample = sample["Fn::If"][1]  # the secure branch (TLS, when configured)
                if isinstance(sample, Mapping) and "Fn::Sub" in sample:
                    return re.sub(
                        r"\$\{[^}]+\}", "internal-alb.example.internal", sample["Fn::Sub"]
                    )
                return _resolve(sample, exporter, all_templates)
        raise AssertionError(f"no template exports {export}")
    raise AssertionError(f"cannot resolve {value!r}")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_container_settings_validate(
    name: str,
    ecs_containers: list[Container],
    cfn_templates: dict[str, dict[str, Any]],
    clean_settings_env: pytest.MonkeyPatch,
) -> None:
    """The settings a container gets (parameters at their defaults) are valid settings."""
    spec, container = SPECS[name], _by_name(ecs_containers)[name]
    template = cfn_templates[container.template]
    for variable, value in container.environment.items():
        clean_settings_env.setenv(variable, _resolve(value, template, cfn_templates))
    for variable, value_from in container.secrets.items():
        arn = deploy_model.secret_resource(value_from)
        sample = SAMPLE_SECRETS_BY_ARN.get(arn.get("Ref", "") if isinstance(arn, Mapping) else "")
        clean_settings_env.setenv(variable, sample or SAMPLE_SECRETS[variable])
    for cls in spec.settings_classes():
        cls()


def test_every_imported_value_is_exported(cfn_templates: dict[str, dict[str, Any]]) -> None:
    imports = re.findall(
        r"'Fn::ImportValue': \{'Fn::Sub': '\$\{(\w+)\}-(\w+)'\}", str(cfn_templates)
    )
    assert imports
    for stack_param, export in imports:
        exporter = cfn_templates[EXPORTING_TEMPLATE[stack_param]]
        exported = {
            output["Export"]["Name"]["Fn::Sub"]
            for output in exporter["Outputs"].values()
            if "Export" in output
        }
        assert f"${{AWS::StackName}}-{export}" in exported, (
            f"{stack_param} does not export {export}"
        )


def test_execution_roles_read_exactly_their_secrets(
    ecs_containers: list[Container], cfn_templates: dict[str, dict[str, Any]]
) -> None:
    needed: dict[tuple[str, str], set[str]] = {}
    for container in ecs_containers:
        role = container.properties["ExecutionRoleArn"]["Fn::GetAtt"][0]
        needed.setdefault((container.template, role), set()).update(
            str(deploy_model.secret_resource(value)) for value in container.secrets.values()
        )
    for (template_name, role), secrets in needed.items():
        template = cfn_templates[template_name]
        granted: set[str] = set()
        for statement in deploy_model.role_statements(template, {"Fn::GetAtt": [role, "Arn"]}):
            actions = deploy_model.as_list(statement["Action"])
            if any(action.startswith("secretsmanager:") for action in actions):
                assert actions == ["secretsmanager:GetSecretValue"], actions
                granted |= {
                    str(deploy_model.secret_resource(item))
                    for item in deploy_model.as_list(statement["Resource"])
                }
        assert granted == secrets, f"{role} reads {granted}, its tasks need {secrets}"


# What every service's collector needs: EMF log events into the metrics log group, X-Ray.
TELEMETRY_ACTIONS = {
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "logs:DescribeLogStreams",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
}
XRAY_ACTIONS = {action for action in TELEMETRY_ACTIONS if action.startswith("xray:")}
EXPECTED_TASK_ACTIONS = {
    "dispatcher": TELEMETRY_ACTIONS,
    "scheduler": TELEMETRY_ACTIONS,
    "reaper": TELEMETRY_ACTIONS,
    "outbox-relay": TELEMETRY_ACTIONS | {"sqs:SendMessage", "sqs:GetQueueUrl"},
    # Creates each buffered dataset's buffer and DLQ, drains them, dead-letters itself.
    "sink": TELEMETRY_ACTIONS
    | {
        "sqs:CreateQueue",
        "sqs:GetQueueUrl",
        "sqs:GetQueueAttributes",
        "sqs:SetQueueAttributes",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:SendMessage",
    },
    # Its sts:AssumeRole is a policy of its own (CredentialBrokerAssumePolicy).
    "credential-broker": TELEMETRY_ACTIONS,
    # Its sts:AssumeRole is a policy of its own too (QueryServiceAssumePolicy).
    "query-service": TELEMETRY_ACTIONS,
    "worker": TELEMETRY_ACTIONS
    | {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueUrl",
        "sqs:SendMessage",  # records published to buffered datasets' buffer queues
        "ecs:UpdateTaskProtection",  # scale-in protection of its own task while busy
        "ecs:GetTaskProtection",
    },
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_task_roles_are_least_privilege(
    name: str, ecs_containers: list[Container], cfn_templates: dict[str, dict[str, Any]]
) -> None:
    container = _by_name(ecs_containers)[name]
    role = container.properties.get("TaskRoleArn")
    if name not in EXPECTED_TASK_ACTIONS:
        assert role is None, f"{name} needs no AWS permissions, yet has task role {role}"
        return
    statements = deploy_model.role_statements(cfn_templates[container.template], role)
    actions = {a for s in statements for a in deploy_model.as_list(s["Action"])}
    assert actions == EXPECTED_TASK_ACTIONS[name]
    for statement in statements:
        if statement["Resource"] == "*":
            assert set(deploy_model.as_list(statement["Action"])) <= XRAY_ACTIONS, statement
    sqs = [
        r
        for s in statements
        if any(str(a).startswith("sqs:") for a in deploy_model.as_list(s["Action"]))
        for r in deploy_model.as_list(s["Resource"])
    ]
    if name == "worker":
        # Its own queue, from the queue's stack; and send-only to the buffer queues of buffered
        # datasets (publish_records).
        buffers = {
            "Fn::Sub": [
                "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${Prefix}buffer-*",
                {"Prefix": {"Fn::ImportValue": {"Fn::Sub": "${PlatformStackName}-SqsQueuePrefix"}}},
            ]
        }
        assert sqs == [{"Fn::ImportValue": {"Fn::Sub": "${QueueStackName}-QueueArn"}}, buffers]
        send_only = [s for s in statements if s["Resource"] == buffers]
        assert [deploy_model.as_list(s["Action"]) for s in send_only] == [["sqs:SendMessage"]]


def test_no_policy_grants_wildcard_actions(cfn_templates: dict[str, dict[str, Any]]) -> None:
    for template_name, template in cfn_templates.items():
        for role in deploy_model.resources_of_type(template, "AWS::IAM::Role"):
            for statement in deploy_model.role_statements(template, {"Fn::GetAtt": [role, "Arn"]}):
                for action in deploy_model.as_list(statement["Action"]):
                    assert "*" not in action, f"{template_name} {role}: {action}"
                if statement["Resource"] == "*":
                    actions = set(deploy_model.as_list(statement["Action"]))
                    assert (
                        actions == {"ecr:GetAuthorizationToken"}
                        or actions <= XRAY_ACTIONS
                        or actions == {"ec2:DescribeNetworkInterfaces"}
                    ), statement


def test_worker_stop_timeout_covers_the_drain(
    ecs_containers: list[Container], cfn_templates: dict[str, dict[str, Any]]
) -> None:
    container = _by_name(ecs_containers)["worker"]
    template = cfn_templates[container.template]
    env = container.environment
    drain_param = env["TASKPLAT_WORKER_DRAIN_TIMEOUT_SECONDS"]["Ref"]
    stop = container.definition["StopTimeout"]["Fn::FindInMap"]
    assert stop[1] == {"Ref": drain_param}
    table = template["Mappings"][stop[0]]
    allowed = template["Parameters"][drain_param]["AllowedValues"]
    assert sorted(table, key=float) == sorted(allowed, key=float)
    kill, report = (
        float(env["TASKPLAT_WORKER_KILL_GRACE_SECONDS"]),
        float(env["TASKPLAT_WORKER_SHUTDOWN_REPORT_TIMEOUT_SECONDS"]),
    )
    wait = float(env["TASKPLAT_WORKER_WAIT_TIME_SECONDS"])
    for drain, row in table.items():
        needed = max(float(drain) + kill + report, wait + 5)
        assert needed + 10 <= row[stop[2]] <= 120, f"drain {drain}: stopTimeout {row[stop[2]]}"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_health_check_probes_the_services_healthz(
    name: str, ecs_containers: list[Container]
) -> None:
    spec, container = SPECS[name], _by_name(ecs_containers)[name]
    if spec.health_port_env is None:  # a one-off task: ECS only waits for its exit code
        assert "HealthCheck" not in container.definition
        return
    port = container.environment[spec.health_port_env]
    command = container.definition["HealthCheck"]["Command"]
    assert command[:3] == ["CMD", "python", "-c"], command
    assert f"http://127.0.0.1:{port}/healthz" in command[3]
    dockerfile = spec.parsed_dockerfile()
    assert dockerfile.final.env()[spec.health_port_env] == port, "image and task disagree"


def test_dispatcher_listens_where_the_load_balancers_and_health_check_look(
    ecs_containers: list[Container], cfn_templates: dict[str, dict[str, Any]]
) -> None:
    container = _by_name(ecs_containers)["dispatcher"]
    template = cfn_templates[container.template]
    env = container.environment
    port = int(env["TASKPLAT_DISPATCHER_PORT"])
    assert env["TASKPLAT_DISPATCHER_HOST"] == "0.0.0.0"
    assert [m["ContainerPort"] for m in container.definition["PortMappings"]] == [port]
    check = " ".join(container.definition["HealthCheck"]["Command"])
    assert f"http://127.0.0.1:{port}/healthz" in check
    groups = {
        logical_id: group
        for logical_id, group in deploy_model.resources_of_type(
            template, "AWS::ElasticLoadBalancingV2::TargetGroup"
        ).items()
        if logical_id in {"PublicTargetGroup", "InternalTargetGroup", "InternalClaimTargetGroup"}
    }
    assert len(groups) == 3
    for group in groups.values():
        assert group["Properties"]["Port"] == port
        assert group["Properties"]["HealthCheckPath"] == "/healthz"
    service = template["Resources"]["DispatcherService"]["Properties"]
    assert {lb["ContainerPort"] for lb in service["LoadBalancers"]} == {port}
    assert {lb["TargetGroupArn"]["Ref"] for lb in service["LoadBalancers"]} == set(groups)


def test_internal_routes_are_reachable_only_inside_the_vpc(
    cfn_templates: dict[str, dict[str, Any]],
) -> None:
    template = cfn_templates["platform.yaml"]
    resources = template["Resources"]
    assert resources["InternalLoadBalancer"]["Properties"]["Scheme"] == "internal"
    ingress = resources["InternalAlbSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert [rule["CidrIp"] for rule in ingress] == [{"Ref": "VpcCidr"}]
    # The public listener refuses everything it does not explicitly forward...
    public = resources["PublicListener"]["Properties"]
    assert [action["Type"] for action in public["DefaultActions"]] == ["fixed-response"]
    # ...and forwards only the task API and the open health routes.
    forwarded: list[str] = []
    rules = deploy_model.resources_of_type(template, "AWS::ElasticLoadBalancingV2::ListenerRule")
    for rule in rules.values():
        if rule["Properties"]["ListenerArn"] == {"Ref": "PublicListener"}:
            for condition in rule["Properties"]["Conditions"]:
                assert condition["Field"] == "path-pattern"
                forwarded += condition["PathPatternConfig"]["Values"]
    assert sorted(forwarded) == sorted(
        ["/tasks", "/tasks/*", "/healthz", "/readyz", "/openapi.json"]
    )
    assert not any(path.startswith("/internal") or "*" in path.split("/")[1] for path in forwarded)
    # The internal listener forwards only the worker API and the health routes (not /metrics).
    internal = resources["InternalListener"]["Properties"]
    assert [action["Type"] for action in internal["DefaultActions"]] == ["fixed-response"]
    internal_paths = [
        value
        for rule in rules.values()
        if rule["Properties"]["ListenerArn"] == {"Ref": "InternalListener"}
        for condition in rule["Properties"]["Conditions"]
        for value in condition["PathPatternConfig"]["Values"]
    ]
    assert sorted(internal_paths) == [
        "/healthz",
        "/internal/*",
        "/internal/task-claim-next",
        "/readyz",
    ]
    # Only the two ALBs may reach the dispatcher's port.
    sources = resources["DispatcherSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert {rule["SourceSecurityGroupId"]["Ref"] for rule in sources} == {
        "PublicAlbSecurityGroup",
        "InternalAlbSecurityGroup",
    }


def test_only_services_with_a_database_url_join_the_database_security_group(
    cfn_templates: dict[str, dict[str, Any]],
) -> None:
    for template_name, template in cfn_templates.items():
        for service_id, service in deploy_model.resources_of_type(
            template, "AWS::ECS::Service"
        ).items():
            groups = str(service["Properties"]["NetworkConfiguration"])
            task_definition = template["Resources"][service["Properties"]["TaskDefinition"]["Ref"]]
            uses_database = "DATABASE_URL" in str(task_definition["Properties"])
            assert ("DatabaseClientSecurityGroupId" in groups) == uses_database, service_id
            if template_name == "worker-pool.yaml":
                assert not uses_database, "a worker never talks to Postgres"


def test_every_service_scales_on_its_own(cfn_templates: dict[str, dict[str, Any]]) -> None:
    for template in cfn_templates.values():
        services = deploy_model.resources_of_type(template, "AWS::ECS::Service")
        targets = deploy_model.resources_of_type(
            template, "AWS::ApplicationAutoScaling::ScalableTarget"
        )
        policies = deploy_model.resources_of_type(
            template, "AWS::ApplicationAutoScaling::ScalingPolicy"
        )
        scaled = {
            match.group(1)
            for t in targets.values()
            if (match := re.search(r"\$\{(\w+)\.Name\}", str(t["Properties"]["ResourceId"])))
        }
        assert len(scaled) == len(targets)
        assert scaled == set(services)
        with_policy = {p["Properties"]["ScalingTargetId"]["Ref"] for p in policies.values()}
        assert with_policy == set(targets)
        for service_id, service in services.items():
            # Its own parameter (zero while the platform stack is paused).
            desired = service["Properties"]["DesiredCount"]
            if "Fn::If" in desired:
                assert desired["Fn::If"][:2] == ["Paused", 0], service_id
                desired = desired["Fn::If"][2]
            assert desired == {"Ref": f"{service_id.removesuffix('Service')}DesiredCount"}
    worker_policy = cfn_templates["worker-pool.yaml"]["Resources"]["WorkerBacklogScaling"]
    metrics = str(worker_policy["Properties"])
    assert "ApproximateNumberOfMessagesVisible" in metrics and "RunningTaskCount" in metrics


def test_queue_names_match_what_the_services_compute(
    cfn_templates: dict[str, dict[str, Any]], clean_settings_env: pytest.MonkeyPatch
) -> None:
    from taskplat.common.settings import SqsSettings
    from taskplat.common.sqs import sqs_queue_name

    queue = cfn_templates["task-queue.yaml"]
    params = queue["Parameters"]
    platform = cfn_templates["platform.yaml"]["Parameters"]
    assert params["SqsQueuePrefix"]["Default"] == platform["SqsQueuePrefix"]["Default"]
    settings = SqsSettings()
    assert settings.sqs_queue_prefix == platform["SqsQueuePrefix"]["Default"]
    assert settings.dead_letter_queue_name == platform["DeadLetterQueueName"]["Default"]
    name = queue["Resources"]["TaskQueueSqs"]["Properties"]["QueueName"]["Fn::Sub"]
    assert name == "${SqsQueuePrefix}${TaskQueue}"
    assert sqs_queue_name(settings, "default") == "taskplat-default"
    redrive = queue["Resources"]["TaskQueueSqs"]["Properties"]["RedrivePolicy"]
    assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": ["PoisonMessageQueue", "Arn"]}


def test_only_the_signers_read_private_token_keys(ecs_containers: list[Container]) -> None:
    """The dispatcher and the relay read the signing keys; the broker and the query service read
    the capability keys' public halves from their own secret, and no active key id."""
    signing = {"CapabilityTokenKeysSecretArn", "AttemptTokenKeysSecretArn"}
    for container in ecs_containers:
        read = {
            deploy_model.secret_resource(value)["Ref"]
            for value in container.secrets.values()
            if "Ref" in deploy_model.secret_resource(value)
        }
        if container.name in {"dispatcher", "outbox-relay"}:
            assert "CapabilityTokenKeysSecretArn" in read, container.name
            assert "CapabilityTokenPublicKeysSecretArn" not in read, container.name
        else:
            assert not read & signing, f"{container.name} reads {sorted(read & signing)}"
        if container.name in {"credential-broker", "query-service"}:
            assert "CapabilityTokenPublicKeysSecretArn" in read, container.name
            assert "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID" not in container.environment
