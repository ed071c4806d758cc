"""Database credentials on ECS: two roles, and a password that rotates without downtime.

Checked: only the migration task reads the schema owner's URL, through an execution role of its
own; every service that reads the application URL also gets the rotated user and password from
the keys of DatabaseCredentialsSecretArn when that is set (libpq reads PGUSER and PGPASSWORD
when the URL names neither); the rotation schedule exists exactly when a rotation function is
given, on that secret.
"""

from __future__ import annotations

from typing import Any

import deploy_model

Templates = dict[str, dict[str, Any]]


def _platform_containers(cfn_templates: Templates) -> list[deploy_model.Container]:
    return [
        c
        for c in deploy_model.all_containers(cfn_templates)
        if c.template == "platform.yaml" and c.name != deploy_model.COLLECTOR
    ]


def test_only_the_migration_task_reads_the_owner_url(cfn_templates: Templates) -> None:
    owner = {"Ref": "MigrationDatabaseUrlSecretArn"}
    for container in _platform_containers(cfn_templates):
        reads_owner = owner in container.secrets.values()
        assert reads_owner == (container.name == "migrate"), container.name
        if container.name == "migrate":
            assert container.secrets == {"DATABASE_URL": owner}
            role = container.properties["ExecutionRoleArn"]
            assert role == {"Fn::GetAtt": ["MigrateExecutionRole", "Arn"]}
    users = [
        c.name
        for c in deploy_model.all_containers(cfn_templates)
        if c.properties["ExecutionRoleArn"] == {"Fn::GetAtt": ["MigrateExecutionRole", "Arn"]}
    ]
    assert users == ["migrate"]


def test_services_get_the_rotated_credentials_beside_the_url(cfn_templates: Templates) -> None:
    services = [
        c
        for c in _platform_containers(cfn_templates)
        if c.secrets.get("DATABASE_URL") == {"Ref": "DatabaseUrlSecretArn"}
    ]
    assert {c.name for c in services} >= {"dispatcher", "outbox-relay", "scheduler", "reaper"}
    for container in services:
        conditional = [
            item["Fn::If"]
            for item in container.definition["Secrets"]
            if isinstance(item, dict) and "Fn::If" in item
        ]
        by_name = {
            branch[1]["Name"]: branch
            for branch in conditional
            if branch[1]["Name"] in deploy_model.LIBPQ_CREDENTIALS
        }
        assert set(by_name) == deploy_model.LIBPQ_CREDENTIALS, container.name
        for name, key in (("PGUSER", "username"), ("PGPASSWORD", "password")):
            condition, secret, otherwise = by_name[name]
            assert condition == "HasDatabaseCredentials"
            assert secret["ValueFrom"] == {"Fn::Sub": f"${{DatabaseCredentialsSecretArn}}:{key}::"}
            assert otherwise == {"Ref": "AWS::NoValue"}


def test_rotation_schedule_follows_the_rotation_function(cfn_templates: Templates) -> None:
    template = cfn_templates["platform.yaml"]
    ((_schedule_id, schedule),) = deploy_model.resources_of_type(
        template, "AWS::SecretsManager::RotationSchedule"
    ).items()
    assert schedule["Condition"] == "RotatesDatabasePassword"
    assert schedule["Properties"]["SecretId"] == {"Ref": "DatabaseCredentialsSecretArn"}
    assert schedule["Properties"]["RotationLambdaARN"] == {"Ref": "DatabaseRotationLambdaArn"}
    condition = str(template["Conditions"]["RotatesDatabasePassword"])
    assert "HasDatabaseCredentials" in condition and "DatabaseRotationLambdaArn" in condition
