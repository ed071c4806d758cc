"""What a stack prepares before any service starts: its SQS queues, the migrated database, and
the environment every service shares.

Invariants: each step raises `DevstackError` naming what failed, never a library's exception; the
attempt-token signing key (Ed25519) is derived from the worker token and goes to the dispatcher
and the relay through the shared environment (the stack gives workers and the data services none
of it, see `services.py` and `data_services.py`).
"""

from __future__ import annotations

import hashlib
import json

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.sqs import sqs_client
from taskplat.devstack.stack.config import StackConfig

DEV_ATTEMPT_KID = "devstack"


def attempt_key(worker_token: str) -> str:
    """The stack's attempt-token signing key, an Ed25519 private key in PEM (stable for a run
    directory's worker token)."""
    from taskplat.common.tokens.keys import private_key_pem

    return private_key_pem(
        hashlib.sha256(f"taskplat-attempt-token:{worker_token}".encode()).digest()
    )


def create_queues(config: StackConfig, endpoint_url: str) -> None:
    """The stack's queues (each with its DLQ) and its dead-letter queue, created if missing."""
    from botocore.exceptions import BotoCoreError, ClientError

    from taskplat.common.sqs import ensure_queue

    client = sqs_client(endpoint_url, config.aws_region)
    try:
        for queue in config.queues:
            name = f"{config.queue_prefix}{queue}"
            ensure_queue(
                client,
                name,
                dead_letter_queue_name=f"{name}-dlq",
                max_receive_count=config.max_receive_count,
            )
        ensure_queue(client, config.dead_letter_queue)
    except (BotoCoreError, ClientError) as exc:
        raise DevstackError(f"cannot create the SQS queues at {endpoint_url}: {exc}") from exc
    finally:
        client.close()


def migrate(database_url: str) -> None:
    """Apply every migration to `database_url`."""
    import psycopg

    from taskplat.common.db.migrate import MigrationError, apply_migrations

    try:
        apply_migrations(database_url)
    except (psycopg.Error, MigrationError) as exc:
        raise DevstackError(f"cannot migrate the database: {exc}") from exc


def shared_env(
    config: StackConfig,
    database_url: str,
    sqs_endpoint_url: str,
    dispatcher_url: str,
    port: int,
    api_key: str,
    worker_token: str,
) -> dict[str, str]:
    """The environment every service of the stack starts from."""
    env = config.base_environment()
    env.update(
        DATABASE_URL=database_url,
        SQS_ENDPOINT_URL=sqs_endpoint_url,
        AWS_REGION=config.aws_region,
        TASKPLAT_SQS_QUEUE_PREFIX=config.queue_prefix,
        TASKPLAT_DEAD_LETTER_QUEUE=config.dead_letter_queue,
        TASKPLAT_API_KEYS=api_key,
        TASKPLAT_WORKER_TOKEN=worker_token,
        TASKPLAT_WORKER_DISPATCHER_URL=dispatcher_url,
        TASKPLAT_DISPATCHER_HOST="127.0.0.1",
        TASKPLAT_DISPATCHER_PORT=str(port),
        # The queue registry: POST /tasks accepts the stack's queues only.
        TASKPLAT_DISPATCHER_QUEUES=",".join(config.queues),
        # The dispatcher signs and verifies, and the relay signs (Lambda attempts), attempt
        # tokens with one Ed25519 key derived from the worker token; workers and the data
        # services never get it.
        TASKPLAT_ATTEMPT_TOKEN_KEYS=json.dumps({DEV_ATTEMPT_KID: attempt_key(worker_token)}),
        TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID=DEV_ATTEMPT_KID,
        PYTHONUNBUFFERED="1",
    )
    env.update(config.env)
    return env
