"""Every API route of the dispatcher in one table: the task routes and the DAG and dataset routes.

Invariant: the app and the OpenAPI document are both built from `ALL_ROUTES`, so a route exists
exactly when it is documented.
"""

from __future__ import annotations

from taskplat.dispatcher.dag_routes import DAG_ROUTES
from taskplat.dispatcher.routes import ROUTES, RouteSpec

ALL_ROUTES: tuple[RouteSpec, ...] = ROUTES + DAG_ROUTES
