"""The sink and the credential broker are in the platform template before their code lands:
off by default, each with its own image, log group, collector and least-privilege role, so
turning one on is a parameter once its image exists.

Once `services/<dir>` exists, the container is a service container like any other
(deploy_model.UPCOMING) and the checks of test_task_definitions.py apply to it.
"""

from __future__ import annotations

from typing import Any

import deploy_model
import pytest

Templates = dict[str, dict[str, Any]]

UPCOMING_RESOURCES = {
    "sink": ("SinkEnabled", "RunsSink", "SinkTaskDefinition", "SinkService", "taskplat-sink"),
    "credential-broker": (
        "CredentialBrokerEnabled",
        "RunsCredentialBroker",
        "CredentialBrokerTaskDefinition",
        "CredentialBrokerService",
        "taskplat-credential-broker",
    ),
}


def _platform(cfn_templates: Templates) -> dict[str, Any]:
    return cfn_templates["platform.yaml"]


def _statements(cfn_templates: Templates, role: str) -> list[Any]:
    return deploy_model.role_statements(_platform(cfn_templates), {"Fn::GetAtt": [role, "Arn"]})


@pytest.mark.parametrize("name", sorted(UPCOMING_RESOURCES))
def test_off_by_default_and_complete_when_on(name: str, cfn_templates: Templates) -> None:
    parameter, condition, task_id, service_id, image = UPCOMING_RESOURCES[name]
    template = _platform(cfn_templates)
    assert template["Parameters"][parameter]["Default"] == "false"
    assert template["Conditions"][condition] == {"Fn::Equals": [{"Ref": parameter}, "true"]}
    resources = template["Resources"]
    # Everything that references the service exists exactly when it does.
    for logical_id, resource in resources.items():
        if service_id in str(resource) or task_id in str(resource):
            assert resource.get("Condition") == condition, logical_id
    task = resources[task_id]["Properties"]
    (container,) = [c for c in task["ContainerDefinitions"] if c["Name"] != deploy_model.COLLECTOR]
    assert container["Name"] == name
    assert deploy_model.image_repository(container["Image"]) == image
    assert container["Command"] == [image]
    assert container["ReadonlyRootFilesystem"] is True
    service = resources[service_id]["Properties"]
    assert service["ServiceName"] == name
    assert service["DesiredCount"] == {
        "Fn::If": ["Paused", 0, {"Ref": f"{service_id.removesuffix('Service')}DesiredCount"}]
    }


def test_sink_consumes_only_the_buffer_queues(cfn_templates: Templates) -> None:
    statements = _statements(cfn_templates, "SinkTaskRole")
    sqs = [s for s in statements if str(s["Action"]).count("sqs:")]
    assert len(sqs) == 1
    # <prefix>buffer-<dataset> and its -dlq, as the sink names them; never a task queue.
    arn = "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${SqsQueuePrefix}buffer-*"
    assert sqs[0]["Resource"] == {"Fn::Sub": arn}


def test_credential_broker_may_only_assume_the_data_access_role(cfn_templates: Templates) -> None:
    resources = _platform(cfn_templates)["Resources"]
    assume = resources["CredentialBrokerAssumePolicy"]["Properties"]
    assert assume["Roles"] == [{"Ref": "CredentialBrokerTaskRole"}]
    (statement,) = assume["PolicyDocument"]["Statement"]
    assert statement["Resource"] == {"Fn::GetAtt": ["DataAccessRole", "Arn"]}
    assert statement["Action"] == "sts:AssumeRole"
    inline = _statements(cfn_templates, "CredentialBrokerTaskRole")
    assert not [s for s in inline if "sts:" in str(s["Action"]) or "s3:" in str(s["Action"])]
    data = resources["DataAccessRole"]["Properties"]
    (trust,) = data["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"AWS": {"Fn::GetAtt": ["CredentialBrokerTaskRole", "Arn"]}}
    resources_granted = {
        str(r) for s in _statements(cfn_templates, "DataAccessRole") for r in [s["Resource"]]
    }
    assert all("${DataBucketName}" in r for r in resources_granted), resources_granted
    # Reachable only through the internal ALB; no database access.
    service = resources["CredentialBrokerService"]["Properties"]
    groups = service["NetworkConfiguration"]["AwsvpcConfiguration"]["SecurityGroups"]
    assert groups == [{"Ref": "CredentialBrokerSecurityGroup"}]
    ingress = resources["CredentialBrokerSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert [rule["SourceSecurityGroupId"] for rule in ingress] == [
        {"Ref": "InternalAlbSecurityGroup"}
    ]


def test_credential_broker_reads_only_the_capability_token_keys(cfn_templates: Templates) -> None:
    resources = _platform(cfn_templates)["Resources"]
    task = resources["CredentialBrokerTaskDefinition"]["Properties"]
    (broker,) = [c for c in task["ContainerDefinitions"] if c["Name"] == "credential-broker"]
    assert broker["Secrets"] == [
        {
            "Name": "TASKPLAT_CAPABILITY_TOKEN_KEYS",
            "ValueFrom": {"Ref": "CapabilityTokenPublicKeysSecretArn"},
        }
    ]
    assert task["ExecutionRoleArn"] == {"Fn::GetAtt": ["CredentialBrokerExecutionRole", "Arn"]}
    granted = [
        deploy_model.secret_resource(s["Resource"])
        for s in _statements(cfn_templates, "CredentialBrokerExecutionRole")
        if s["Action"] == "secretsmanager:GetSecretValue"
    ]
    assert granted == [{"Ref": "CapabilityTokenPublicKeysSecretArn"}]
