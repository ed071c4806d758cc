"""Operator configuration: `operators.yaml` maps each operator name to how it is run.

Invariants:
  * The file is validated strictly (unknown keys are errors) when the wrapper starts; a bad file
    stops the wrapper with one clear message, never at the first task.
  * An operator's environment holds only the variables its `env` allow-list names (plus the
    per-task `TASKPLAT_*` and `TRACEPARENT`/`TRACESTATE` variables the wrapper sets, which the
    allow-list cannot name); the allow-list can never name the worker token nor any other
    `TASKPLAT_WORKER_*` setting nor an AWS credential variable, so operator code never sees the
    wrapper's dispatcher or AWS credentials.
  * `{python}` in a command stands for the wrapper's own interpreter (`sys.executable`), and
    `{here}` for the directory of the operators file (resolved, absolute): an operator's working
    directory is its task's scratch directory, so a path next to the file is named through it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from taskplat.common.contracts.base import OperatorName
from taskplat.common.errors import ConfigurationError
from taskplat.worker_wrapper.isolation import SECRET_ENV_VARS

OperatorMode = Literal["per-task", "pooled"]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]

# Variables the wrapper sets itself for each task (per-task mode) or each process.
TASK_ENV_VARS = frozenset(
    {
        "TASKPLAT_TASK_ID",
        "TASKPLAT_ATTEMPT",
        "TASKPLAT_LEASE_TOKEN",
        "TASKPLAT_DEADLINE_AT",
        "TASKPLAT_OPERATOR",
        "TASKPLAT_OPERATOR_MODE",
        "TRACEPARENT",
        "TRACESTATE",
        "TASKPLAT_CAPABILITY_TOKEN",
        "TRACE_TASK_CAPABILITY_TOKEN",
        "TASKPLAT_SCRATCH_DIR",
    }
)
_FORBIDDEN_PREFIX = "TASKPLAT_WORKER_"
# The platform's service URLs an operator calls with its capability token (the query service, the
# credential broker): passed through from the wrapper's environment to every operator, no
# allow-list needed (they are addresses, not secrets).
PLATFORM_URL_VARS = ("TASKPLAT_QUERY_URL", "TASKPLAT_CREDENTIALS_URL")


class OperatorsFileError(ConfigurationError):
    code = "operators_file_error"


class OperatorSpec(BaseModel):
    """How one operator runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = Field(
        description="argv of the operator; `{python}` is replaced by the wrapper's interpreter, "
        "`{here}` by the directory of the operators file."
    )
    env: tuple[EnvName, ...] = Field(
        (), description="Names of variables passed through from the wrapper's environment."
    )
    timeout_seconds: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="Default hard timeout of a task of this operator when the task sets none "
        "(the smaller of this and the dispatcher's deadline applies).",
    )
    mode: OperatorMode = Field(
        "per-task",
        description="`per-task`: a fresh process per task (untrusted code); `pooled`: long-lived "
        "processes serving one task at a time each, recycled after a crash, a kill or a protocol "
        "error.",
    )
    pool_size: Annotated[int, Field(ge=1, le=256)] | None = Field(
        None, description="Processes of a pooled operator (default 1)."
    )
    warm_processes: Annotated[int, Field(ge=0, le=256)] | None = Field(
        None,
        description="Processes of a pooled operator started when the wrapper starts, before it "
        "takes any work (default: the whole pool; 0: each starts on first use).",
    )
    untrusted: bool = Field(
        False,
        description="Untrusted code: each task runs in a fresh process (per-task mode only) with "
        "its own scratch directory, as the operator user where the wrapper can switch users, and "
        "gets the claim's capability token.",
    )

    @field_validator("env")
    @classmethod
    def _no_credentials(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            upper = name.upper()
            if upper.startswith(_FORBIDDEN_PREFIX):
                raise ValueError(f"{name} is a wrapper setting and is never passed to an operator")
            if upper in TASK_ENV_VARS:
                raise ValueError(f"{name} is set by the wrapper for each task")
            if upper in SECRET_ENV_VARS:
                raise ValueError(f"{name} holds the wrapper's credentials")
        return names

    @model_validator(mode="after")
    def _pool_size_only_pooled(self) -> Self:
        if self.pool_size is not None and self.mode != "pooled":
            raise ValueError("pool_size applies to pooled operators only")
        if self.warm_processes is not None:
            if self.mode != "pooled":
                raise ValueError("warm_processes applies to pooled operators only")
            if self.warm_processes > self.processes:
                raise ValueError("warm_processes is larger than pool_size")
        if self.untrusted and self.mode != "per-task":
            raise ValueError("untrusted operators run in per-task mode only")
        return self

    @property
    def processes(self) -> int:
        return self.pool_size or 1

    @property
    def warm(self) -> int:
        """Processes to start before the wrapper takes work (pooled operators only)."""
        if self.mode != "pooled":
            return 0
        return self.processes if self.warm_processes is None else self.warm_processes

    def argv(self, python: str | None = None) -> list[str]:
        interpreter = python or sys.executable
        return [part.replace("{python}", interpreter) for part in self.command]


class OperatorsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    operators: dict[OperatorName, OperatorSpec] = Field(
        description="Operators by name (the `operator` of a task)."
    )


def default_operators_file() -> Path:
    return Path(str(resources.files("taskplat.worker_wrapper").joinpath("operators.yaml")))


def load_operators(path: Path | None = None) -> Mapping[str, OperatorSpec]:
    """Read and validate an operators file; raise `OperatorsFileError` with a one-line reason."""
    path = path or default_operators_file()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise OperatorsFileError(f"cannot read operators file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())
        raise OperatorsFileError(f"operators file {path} is not valid YAML: {reason}") from exc
    try:
        parsed = OperatorsFile.model_validate(data)
    except ValidationError as exc:
        raise OperatorsFileError(f"operators file {path}: {summarize(exc)}") from exc
    here = str(path.resolve().parent)
    return {
        name: spec.model_copy(
            update={"command": [part.replace("{here}", here) for part in spec.command]}
        )
        for name, spec in parsed.operators.items()
    }


def summarize(exc: ValidationError, limit: int = 3) -> str:
    """A one-line summary of a pydantic error: `loc: message` of the first few problems."""
    parts = []
    for error in exc.errors()[:limit]:
        loc = ".".join(str(item) for item in error["loc"]) or "(root)"
        parts.append(f"{loc}: {error['msg']}")
    more = len(exc.errors()) - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)
