"""The Lambda invoker: `invoke_lambda` outbox rows -> a claim made on the function's behalf and
one asynchronous invocation carrying it. It runs in the relay's process on a thread of its own.

`invoker.py` is the loop (one transaction per row: lock, claim, sign, Invoke, mark; its
invariants in full there, its statements in `invoke.sql`); `client.py` is the Lambda side (the
client that retries nothing, the function name, the payload, the Invoke call).

Invariants (stated in full in `invoker`):
  * a task is claimed for a function only by a transaction that also marks its row sent, and only
    after Lambda accepted the invocation, so at most one invocation per attempt can act;
  * a failed Invoke rolls its claim back and backs the row off; it is retried here only;
  * without attempt-token keys (or, for an untrusted job, capability keys) nothing is invoked.
"""

from taskplat.outbox_relay.lambda_invoker.client import (
    InvokeFailed,
    function_name,
    invocation_payload,
    lambda_client,
)
from taskplat.outbox_relay.lambda_invoker.invoker import (
    NO_CAPABILITY_KEYS,
    NO_KEYS,
    Invoker,
    InvokerBatch,
)

__all__ = [
    "NO_CAPABILITY_KEYS",
    "NO_KEYS",
    "InvokeFailed",
    "Invoker",
    "InvokerBatch",
    "function_name",
    "invocation_payload",
    "lambda_client",
]
