"""The policy check (`make deploy-check`, tests/deploy/deploy_policy.py) passes on every template,
and each of its rules really catches the fault it is about (a broken copy of a template fails).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import deploy_model
import deploy_policy
import pytest

Templates = dict[str, dict[str, Any]]


def test_every_template_passes_the_policy_check(cfn_templates: Templates) -> None:
    findings = deploy_policy.check(cfn_templates)
    assert not findings, "\n".join(str(f) for f in findings)


def test_the_make_target_runs_the_same_check() -> None:
    result = subprocess.run(
        [sys.executable, str(deploy_model.REPO / "tests" / "deploy" / "deploy_policy.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(deploy_policy.RULES)} rules, 4 templates, 0 findings" in result.stderr


def _resources(templates: Templates, name: str) -> dict[str, Any]:
    return templates[name]["Resources"]


def _container(templates: Templates, name: str, task: str, container: str) -> dict[str, Any]:
    definitions = _resources(templates, name)[task]["Properties"]["ContainerDefinitions"]
    return next(d for d in definitions if d["Name"] == container)


def _relay_send(templates: Templates) -> dict[str, Any]:
    role = _resources(templates, "platform.yaml")["RelayTaskRole"]["Properties"]
    policy = next(
        p for p in role["Policies"] if p["PolicyName"] == "send-wake-ups-and-dead-letters"
    )
    statement: dict[str, Any] = policy["PolicyDocument"]["Statement"][0]
    return statement


def _wildcard_action(t: Templates) -> None:
    _relay_send(t)["Action"] = ["sqs:*"]


def _star_resource(t: Templates) -> None:
    _relay_send(t)["Resource"] = "*"


def _open_trust(t: Templates) -> None:
    role = _resources(t, "worker-pool.yaml")["WorkerTaskRole"]["Properties"]
    del role["AssumeRolePolicyDocument"]["Statement"][0]["Condition"]


def _lambda_trusts_ecs(t: Templates) -> None:
    role = _resources(t, "lambda-operator.yaml")["FunctionRole"]["Properties"]
    role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] = {
        "Service": "ecs-tasks.amazonaws.com"
    }


def _lambda_retries(t: Templates) -> None:
    config = _resources(t, "lambda-operator.yaml")["EventInvokeConfig"]["Properties"]
    config["MaximumRetryAttempts"] = 2


def _any_repository(t: Templates) -> None:
    role = _resources(t, "worker-pool.yaml")["WorkerExecutionRole"]["Properties"]
    pull = next(p for p in role["Policies"] if p["PolicyName"] == "pull-images")
    pull["PolicyDocument"]["Statement"][1]["Resource"] = {
        "Fn::Sub": "arn:${AWS::Partition}:ecr:${AWS::Region}:${AWS::AccountId}:repository/*"
    }


def _unencrypted_queue(t: Templates) -> None:
    del _resources(t, "task-queue.yaml")["TaskQueueSqs"]["Properties"]["SqsManagedSseEnabled"]


def _eternal_logs(t: Templates) -> None:
    del _resources(t, "platform.yaml")["RelayLogGroup"]["Properties"]["RetentionInDays"]


def _public_ip(t: Templates) -> None:
    network = _resources(t, "platform.yaml")["ReaperService"]["Properties"]
    network["NetworkConfiguration"]["AwsvpcConfiguration"]["AssignPublicIp"] = "ENABLED"


def _no_rollback(t: Templates) -> None:
    config = _resources(t, "worker-pool.yaml")["WorkerService"]["Properties"]
    config["DeploymentConfiguration"]["DeploymentCircuitBreaker"]["Rollback"] = False


def _no_collector(t: Templates) -> None:
    props = _resources(t, "platform.yaml")["SchedulerTaskDefinition"]["Properties"]
    props["ContainerDefinitions"] = [
        d for d in props["ContainerDefinitions"] if d["Name"] != deploy_model.COLLECTOR
    ]


def _plain_secret(t: Templates) -> None:
    worker = _container(t, "worker-pool.yaml", "WorkerTaskDefinition", "worker")
    worker["Environment"].append({"Name": "TASKPLAT_WORKER_TOKEN", "Value": "x" * 32})


def _privileged(t: Templates) -> None:
    _container(t, "platform.yaml", "DispatcherTaskDefinition", "dispatcher")["Privileged"] = True


def _writable_collector(t: Templates) -> None:
    collector = _container(t, "platform.yaml", "ReaperTaskDefinition", deploy_model.COLLECTOR)
    collector["ReadonlyRootFilesystem"] = False


def _lax_headers(t: Templates) -> None:
    del _resources(t, "platform.yaml")["PublicLoadBalancer"]["Properties"]["LoadBalancerAttributes"]


def _old_tls(t: Templates) -> None:
    props = _resources(t, "platform.yaml")["InternalListener"]["Properties"]
    props["SslPolicy"]["Fn::If"][1] = "ELBSecurityPolicy-2016-08"


def _plaintext_worker_api(t: Templates) -> None:
    _resources(t, "platform.yaml")["InternalListener"]["Properties"]["Protocol"] = "HTTP"


def _plaintext_by_default(t: Templates) -> None:
    t["platform.yaml"]["Parameters"]["AllowPlaintextWorkerApi"]["Default"] = "true"


def _silent_alarm(t: Templates) -> None:
    del _resources(t, "platform.yaml")["OutboxAgeAlarm"]["Properties"]["AlarmActions"]


BREAKAGES: dict[str, tuple[str, Callable[[Templates], None]]] = {
    "wildcard action": ("no-wildcard-actions", _wildcard_action),
    "star resource": ("star-resource", _star_resource),
    "trust any account": ("trust", _open_trust),
    "function role trusts another service": ("trust", _lambda_trusts_ecs),
    "Lambda retries its invocations": ("lambda-retries", _lambda_retries),
    "pull from any repository": ("ecr-scope", _any_repository),
    "unencrypted queue": ("queue-encryption", _unencrypted_queue),
    "logs kept forever": ("log-retention", _eternal_logs),
    "public IP": ("private-service", _public_ip),
    "no rollback": ("circuit-breaker", _no_rollback),
    "no collector": ("collector", _no_collector),
    "secret in environment": ("plain-secret", _plain_secret),
    "privileged container": ("privileged", _privileged),
    "writable collector": ("read-only-root", _writable_collector),
    "invalid headers kept": ("alb-headers", _lax_headers),
    "old TLS policy": ("tls-policy", _old_tls),
    "plain worker API": ("worker-api-tls", _plaintext_worker_api),
    "plain HTTP by default": ("worker-api-tls", _plaintext_by_default),
    "alarm without actions": ("alarm-actions", _silent_alarm),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_rule_catches_its_fault(breakage: str, cfn_templates: Templates) -> None:
    rule, breaking = BREAKAGES[breakage]
    broken = copy.deepcopy(cfn_templates)
    breaking(broken)
    assert rule in {finding.rule for finding in deploy_policy.check(broken)}


def test_every_rule_is_exercised() -> None:
    rules = {finding_rule for finding_rule, _ in BREAKAGES.values()}
    assert len(rules) >= len(deploy_policy.RULES)
