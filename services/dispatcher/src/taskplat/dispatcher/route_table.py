"""Every API route of the dispatcher in one table, and the scope each public route needs.

Invariants: the app and the OpenAPI document are both built from `ALL_ROUTES`, so a route exists
exactly when it is documented. Every API-key route names its scope in `SCOPES` (a test fails for
one that does not; served without one, it needs `admin`). `read` is every view, `submit` creates
work, `operate` changes work or DAGs (and is audited), `admin` manages keys and queues and reads the
audit log (and is audited); docs/operations.md lists them.
"""

from __future__ import annotations

from taskplat.common.contracts.access import Scope
from taskplat.dispatcher.access_routes import ACCESS_ROUTES
from taskplat.dispatcher.dag_routes import DAG_ROUTES
from taskplat.dispatcher.route_guard import RouteSpec
from taskplat.dispatcher.routes import ROUTES

ALL_ROUTES: tuple[RouteSpec, ...] = ROUTES + DAG_ROUTES + ACCESS_ROUTES

SCOPES: dict[str, Scope] = {
    # tasks
    "create_task": "submit",
    "create_tasks": "submit",
    "list_tasks": "read",
    "get_task": "read",
    "list_task_events": "read",
    "cancel_task": "operate",
    "retry_task": "operate",
    "retry_tasks": "operate",
    # queues and figures
    "list_queues": "read",
    "get_queue": "read",
    "pause_queue": "operate",
    "resume_queue": "operate",
    "register_queue": "admin",
    "stats": "read",
    # DAGs, jobs and datasets
    "put_dag": "operate",
    "list_dags": "read",
    "get_dag": "read",
    "delete_dag": "operate",
    "start_run": "submit",
    "list_datasets": "read",
    "get_dataset": "read",
    "new_dataset_version": "operate",
    "make_dataset_version_current": "operate",
    "list_dataset_events": "read",
    # access and the fleet
    "create_key": "admin",
    "list_keys": "admin",
    "revoke_key": "admin",
    "list_audit": "admin",  # the log names every key and its scopes, like `GET /keys`
    "list_workers": "read",
}


def scope_of(spec: RouteSpec) -> Scope | None:
    """The scope an API-key route needs (`admin` when the table forgets it); None otherwise."""
    if spec.auth != "api_key":
        return None
    return SCOPES.get(spec.name, "admin")
