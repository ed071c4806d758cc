"""Images of the platform built and run here: `build` (buildah over the Dockerfiles), `cfn` (the
ECS task definitions resolved), `podman` (a task definition's container as `podman run`
arguments), `report` (sizes, layers, SBOMs) and `up` (`make up-images`).

Invariants: nothing here needs a Docker engine; podman and buildah run with the runc runtime and
explicit ulimits (docs/how-to/deploy-ecs.md).
"""
