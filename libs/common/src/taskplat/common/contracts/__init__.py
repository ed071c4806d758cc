"""Pydantic contracts for every HTTP body and SQS message of Taskplat.

Invariants: every model forbids unknown fields (`extra="forbid"`), timestamps must carry a time
zone, UUIDs are parsed as UUIDs. The JSON schema of each model is snapshot-tested, so a contract
change shows in review.
"""

from taskplat.common.contracts.base import Contract
from taskplat.common.contracts.internal import (
    ClaimedResponse,
    ClaimRequest,
    ClaimTask,
    CompleteRequest,
    CompleteResponse,
    CompletionStatus,
    Event,
    EventsAcceptedResponse,
    EventsRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    NotClaimedReason,
    NotClaimedResponse,
    Output,
    RejectedResponse,
    RejectReason,
)
from taskplat.common.contracts.messages import DeadLetterRecord, WakeUpMessage
from taskplat.common.contracts.public import (
    AttemptOutcome,
    AttemptView,
    CreateTaskRequest,
    ErrorResponse,
    JobRef,
    OutputView,
    TaskList,
    TaskStatus,
    TaskView,
)

__all__ = [
    "AttemptOutcome",
    "AttemptView",
    "ClaimRequest",
    "ClaimTask",
    "ClaimedResponse",
    "CompleteRequest",
    "CompleteResponse",
    "CompletionStatus",
    "Contract",
    "CreateTaskRequest",
    "DeadLetterRecord",
    "ErrorResponse",
    "Event",
    "EventsAcceptedResponse",
    "EventsRequest",
    "FetchResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "JobRef",
    "NotClaimedReason",
    "NotClaimedResponse",
    "Output",
    "OutputView",
    "RejectReason",
    "RejectedResponse",
    "TaskList",
    "TaskStatus",
    "TaskView",
    "WakeUpMessage",
]
