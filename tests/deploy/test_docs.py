"""The deploy pages stay true to deploy/ (docs/how-to/deploy-ecs.md, scale.md, rotate-keys.md,
docs/reference/worker-images.md and alarms.md, read as one): a section for every alarm, their shell
snippets parse, their `aws cloudformation deploy` commands use only parameters the templates have
(and name every required one at least once), and every template name and setting they mention
exists."""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Any

import deploy_model
from deploy_model import SPECS

# Backticked CamelCase words in the page that are not template names: AWS API actions and terms.
NOT_TEMPLATE_NAMES = {
    "CMD",
    "Dockerfile",
    "ReceiveMessage",
    "DeleteMessage",
    "ChangeMessageVisibility",
    "GetQueueUrl",
    "ResourceInitializationError",
    "AccessDenied",
    # The operator SDK's names (Lambda operators).
    "Task",
    "OperatorFailure",
    "PermanentFailure",
    # libpq's variables, SQL keywords and the collector's CloudWatch dimension names.
    "PGUSER",
    "PGPASSWORD",
    "LISTEN",
    "NOLOGIN",
    "Service",
    "Stack",
    # Build arguments of deploy/docker/python-service.Dockerfile.
    "SERVICE",
    "PORT",
}


def _docs() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in deploy_model.DOCS)


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.DOTALL)


def _deploy_commands(text: str) -> list[list[str]]:
    commands = []
    for block in _shell_blocks(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("aws cloudformation deploy"):
                commands.append(shlex.split(line, comments=True))
    return commands


def test_every_alarm_has_a_section(cfn_templates: dict[str, dict[str, Any]]) -> None:
    headings = set(re.findall(r"^### (\w+)$", _docs(), re.MULTILINE))
    alarms = {
        logical_id
        for template in cfn_templates.values()
        for logical_id in deploy_model.resources_of_type(template, "AWS::CloudWatch::Alarm")
    }
    assert len(alarms) >= 10
    missing = alarms - headings
    assert not missing, f"the deploy pages have no '### <alarm>' section for {sorted(missing)}"


def test_shell_snippets_parse() -> None:
    blocks = _shell_blocks(_docs())
    assert len(blocks) >= 10
    for block in blocks:
        result = subprocess.run(
            ["bash", "-n"], input=block, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"{result.stderr}\n---\n{block}"


def test_deploy_commands_match_the_templates(cfn_templates: dict[str, dict[str, Any]]) -> None:
    commands = _deploy_commands(_docs())
    named: dict[str, set[str]] = {name: set() for name in cfn_templates}
    for argv in commands:
        template_name = argv[argv.index("--template-file") + 1].removeprefix(
            "deploy/cloudformation/"
        )
        assert template_name in cfn_templates, argv
        parameters = cfn_templates[template_name]["Parameters"]
        start = argv.index("--parameter-overrides") + 1
        overrides = {item.split("=", 1)[0] for item in argv[start:] if "=" in item}
        unknown = overrides - set(parameters)
        assert not unknown, f"{template_name} has no parameters {sorted(unknown)}"
        if deploy_model.resources_of_type(cfn_templates[template_name], "AWS::IAM::Role"):
            assert "CAPABILITY_IAM" in argv, f"{template_name} creates roles: {argv}"
        named[template_name] |= overrides
    for template_name, template in cfn_templates.items():
        required = {name for name, p in template["Parameters"].items() if "Default" not in p}
        assert required <= named[template_name], (
            f"no deploy command of the deploy pages names {sorted(required - named[template_name])}"
            f" of {template_name}"
        )


def test_names_the_page_uses_exist(cfn_templates: dict[str, dict[str, Any]]) -> None:
    text = _docs()
    known = set(NOT_TEMPLATE_NAMES)
    for template in cfn_templates.values():
        known |= set(template["Parameters"]) | set(template["Resources"])
        known |= set(template.get("Outputs", {}))
    words = set(re.findall(r"`([A-Z][A-Za-z0-9]+)`", text))
    assert not words - known, f"unknown template names in docs: {sorted(words - known)}"
    for name in cfn_templates:
        assert f"deploy/cloudformation/{name}" in text
    assert "deploy/docker-compose.yml" in text and "deploy/worker-example/" in text
    settings = set().union(*(spec.accepted_env() for spec in SPECS.values()))
    # The build argument LISTEN_PREFIX names a settings prefix (`<prefix>_HOST`, `<prefix>_PORT`).
    settings |= {spec.args["LISTEN_PREFIX"] for spec in SPECS.values() if spec.build_args}
    variables = set(re.findall(r"\b(TASKPLAT_[A-Z0-9_]*[A-Z0-9])\b", text))
    assert not variables - settings, f"no service reads {sorted(variables - settings)}"
