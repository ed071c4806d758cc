"""The platform from its images: Postgres and the local AWS endpoint on the host (standing in
for RDS, SQS, S3 and STS), every service and the workers as podman containers started as their
ECS task definitions in deploy/cloudformation say.

    with ImageStack(ImageStackConfig(run_dir=Path(".run"), tag="dev")) as stack:
        print(stack.info.dispatcher_url)

Invariants:
- The templates are resolved with the stack parameters of `parameters()`; each container's
  command, environment, secrets, user, ports, volumes, health check, read-only root and stop
  timeout are the template's (`podman.run_args`). The only additions are what AWS gives a task
  without the task definition naming it: the endpoint of the local AWS services
  (`AWS_ENDPOINT_URL`) and its dummy credentials (the task role); and, for workers only when
  `worker_capabilities` names them, the capabilities that let the wrapper run untrusted
  operators as the image's second user (what a pool on EC2 capacity adds with
  `LinuxParameters.Capabilities`; Fargate grants none of them).
- Secrets are podman secrets injected as environment, made from the values the local stack
  stores under each secret ARN; they are removed when the stack stops.
- Worker pools: `workers` containers of `worker_image` serve the task queue `queue`; each
  `WorkerPool` of `pools` is a worker-pool stack of its own (its image, its task queue, created
  like the first and registered with the dispatcher), as a product team deploys its image.
- The migrations run first, as the migration task definition's container (exit code 0 or the
  start fails).
- `start()` returns with every container healthy (its health check, run by this object as ECS
  runs it: `podman healthcheck run`), or stops everything and raises `DevstackError` with the
  failing container's log tail. `start_to_healthy` holds each container's seconds from
  `podman run` to its first passing check.
- `supervise()` starts again any container that exited (as an ECS service replaces a stopped
  task); `stop()` stops workers first, then the services (each with its stop timeout), removes
  containers, volumes and secrets of this stack, then SQS and Postgres. Idempotent.
- `<run_dir>/stack.env` is written last by `start()` and removed first by `stop()`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.images import cfn, containers
from taskplat.devstack.images.podman import HOST_ADDRESS, PODMAN, RunPlan, run_args
from taskplat.devstack.images.stack_config import ImageStackConfig
from taskplat.devstack.ports import free_port
from taskplat.devstack.postgres import PrivatePostgres
from taskplat.devstack.procs import read_tail
from taskplat.devstack.sqs import LocalSqs
from taskplat.devstack.stack import bootstrap, data_services
from taskplat.devstack.stack.config import StackConfig
from taskplat.devstack.stack.secrets import env_file_text, load_or_create_secrets, write_private
from taskplat.devstack.stack.stack import StackInfo

REPO = Path(__file__).resolve().parents[6]
TEMPLATES = REPO / "deploy" / "cloudformation"
STACK_NAME = "taskplat"
QUEUE_STACK = "taskplat-queue"
COLLECTOR = "collector"  # the telemetry sidecar: a public image, not built here
MIGRATE = "migrate"
DATA_BUCKET = "taskplat-images-data"  # not the services' default: a missing setting shows
_SECRET_ARN = "arn:aws:secretsmanager:us-east-1:000000000000:secret:taskplat-{}"
_PLACEHOLDER_IMPORTS = (
    *(f"{STACK_NAME}-{name}" for name in ("ClusterName", "CollectorConfigParameterArn")),
    *(f"{STACK_NAME}-{name}" for name in ("MetricsLogGroupArn", "PrivateSubnetIds")),
    f"{STACK_NAME}-WorkerSecurityGroupId",
    f"{QUEUE_STACK}-QueueArn",
    f"{QUEUE_STACK}-QueueName",
)
_LOCAL_AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


def secret_arn(name: str) -> str:
    return _SECRET_ARN.format(name)


@dataclass
class Running:
    definition: cfn.ContainerDef
    plan: RunPlan
    started_at: float = 0.0
    healthy_after: float | None = None
    restarts: int = 0


class ImageStack:
    """Starts, supervises and stops the platform from its images."""

    def __init__(self, config: ImageStackConfig) -> None:
        self.config = config
        run_dir = config.run_dir.absolute()
        self.run_dir = run_dir
        self.stack_id = hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]
        self.log_dir = run_dir / "images-logs"
        self.containers: dict[str, Running] = {}
        self._postgres: PrivatePostgres | None = None
        self._sqs: LocalSqs | None = None
        self._info: StackInfo | None = None
        self._secret_values: dict[str, str] = {}
        self._podman_secrets: dict[str, str] = {}  # ARN -> podman secret name
        self._lock = threading.Lock()
        self._loggers: list[subprocess.Popen[bytes]] = []

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def info(self) -> StackInfo:
        if self._info is None:
            raise DevstackError("the stack has not been started")
        return self._info

    def __enter__(self) -> ImageStack:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> StackInfo:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> StackInfo:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()
        queues = (self.config.queue, *(pool.queue for pool in self.config.pools))
        local = StackConfig(run_dir=self.run_dir, queues=queues)
        secrets = load_or_create_secrets(self.run_dir / "secrets.env")
        self._postgres = PrivatePostgres(self.run_dir / "images-postgres", die_with_parent=True)
        self._postgres.stop(remove_data=True)  # a fresh database: the migrate task applies all
        database_url = self._postgres.start()
        self._sqs = LocalSqs(self.run_dir / "images-sqs", die_with_parent=True)
        endpoint = self._sqs.start()
        bootstrap.create_queues(local, endpoint)
        data_services.create_bucket(endpoint, local.aws_region, DATA_BUCKET)
        inside_db = database_url.replace("@127.0.0.1:", f"@{HOST_ADDRESS}:")
        keys = data_services.capability_env(secrets.worker_token)
        self._secret_values = {
            secret_arn("database-url"): inside_db,
            secret_arn("migration-database-url"): inside_db,
            secret_arn("worker-token"): secrets.worker_token,
            secret_arn("api-keys"): secrets.api_key,
            secret_arn("capability-token-keys"): keys["TASKPLAT_CAPABILITY_TOKEN_KEYS"],
            secret_arn("capability-token-public-keys"): data_services.verifier_keys(
                keys["TASKPLAT_CAPABILITY_TOKEN_KEYS"]
            ),
            secret_arn("attempt-token-keys"): json.dumps(
                {bootstrap.DEV_ATTEMPT_KID: bootstrap.attempt_key(secrets.worker_token)}
            ),
        }
        ports = {"dispatcher": free_port(), "credential-broker": free_port()}
        ports["query-service"] = free_port()
        extra = {**_LOCAL_AWS, "AWS_ENDPOINT_URL": endpoint.replace("127.0.0.1", HOST_ADDRESS)}
        platform = self._resolve("platform.yaml", self.parameters(keys), {})
        by_name = {c.name: c for c in platform if c.name != COLLECTOR}
        self._run_migrations(by_name.pop(MIGRATE), extra)
        query_url = data_services.create_query_user(database_url, secrets.worker_token)
        self._secret_values[secret_arn("query-database-url")] = query_url.replace(
            "host=127.0.0.1", f"host={HOST_ADDRESS}"
        ).replace("@127.0.0.1:", f"@{HOST_ADDRESS}:")
        inside = {name: f"http://{HOST_ADDRESS}:{port}" for name, port in ports.items()}
        imports = {
            f"{STACK_NAME}-SqsQueuePrefix": local.queue_prefix,
            f"{STACK_NAME}-InternalDispatcherUrl": inside["dispatcher"],
            f"{STACK_NAME}-WorkerTokenSecretArn": secret_arn("worker-token"),
            f"{STACK_NAME}-CredentialBrokerUrl": inside["credential-broker"],
            f"{STACK_NAME}-QueryServiceUrl": inside["query-service"],
            f"{QUEUE_STACK}-TaskQueue": self.config.queue,
        }
        for name in _PLACEHOLDER_IMPORTS:  # what only the collector and the service read
            imports.setdefault(name, f"local-{name}")
        worker = self._worker_definition(self.worker_parameters(), imports)
        for definition in by_name.values():
            self._run(definition, definition.name, extra, ports)
        caps = self.config.worker_capabilities
        for index in range(self.config.workers):
            self._run(worker, f"worker-{index + 1}", extra, {}, cap_add=caps)
        for pool in self.config.pools:
            parameters = {**self.worker_parameters(), "WorkerImage": pool.image}
            definition = self._worker_definition(
                parameters, {**imports, f"{QUEUE_STACK}-TaskQueue": pool.queue}
            )
            for index in range(pool.count):
                self._run(definition, f"{pool.name}-{index + 1}", extra, {}, pool.capabilities)
        self.wait_all_healthy()
        host = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        info = StackInfo(
            dispatcher_url=host["dispatcher"],
            api_key=secrets.api_key,
            worker_token=secrets.worker_token,
            database_url=database_url,
            sqs_endpoint_url=endpoint,
            env_file=self.run_dir / "stack.env",
            credentials_url=host["credential-broker"],
            query_url=host["query-service"],
        )
        header = f"The Taskplat stack from images (`make up-images`): source {info.env_file}"
        write_private(info.env_file, env_file_text(info.as_env(), header))
        self._info = info
        return info

    def stop(self) -> None:
        if self._info is not None:
            self._info.env_file.unlink(missing_ok=True)
            self._info = None
        with self._lock:
            names = sorted(self.containers, key=lambda name: "worker" not in name)
            for name in names:
                running = self.containers[name]
                timeout = running.definition.stop_timeout or 10
                containers.podman(
                    "stop", "--time", str(timeout), running.plan.container_name, check=False
                )
            self.containers.clear()
        for logger in self._loggers:
            logger.terminate()
        for logger in self._loggers:  # reaped, so that none outlives the stack
            try:
                logger.wait(timeout=10)
            except subprocess.TimeoutExpired:
                logger.kill()
                logger.wait()
        self._loggers.clear()
        self._remove_leftovers()
        if self._sqs is not None:
            self._sqs.stop()
            self._sqs = None
        if self._postgres is not None:
            self._postgres.stop(remove_data=True)
            self._postgres = None

    # -- parameters -------------------------------------------------------------------------

    def parameters(self, keys: dict[str, str]) -> dict[str, str]:
        """The platform stack's parameters: every service on, the local secrets' ARNs."""
        values = {
            "VpcId": "vpc-local",
            "VpcCidr": "10.0.0.0/16",
            "PublicSubnetIds": "subnet-local",
            "PrivateSubnetIds": "subnet-local",
            "DatabaseClientSecurityGroupId": "sg-local",
            "ImageRegistry": "localhost",
            "ImageTag": self.config.tag,
            "DatabaseUrlSecretArn": secret_arn("database-url"),
            "MigrationDatabaseUrlSecretArn": secret_arn("migration-database-url"),
            "WorkerTokenSecretArn": secret_arn("worker-token"),
            "ApiKeysSecretArn": secret_arn("api-keys"),
            "TaskQueues": ",".join(
                (self.config.queue, *(pool.queue for pool in self.config.pools))
            ),
            "SinkEnabled": "true",
            "CredentialBrokerEnabled": "true",
            "QueryServiceEnabled": "true",
            "DataBucketName": DATA_BUCKET,
            "CapabilityTokenKeysSecretArn": secret_arn("capability-token-keys"),
            "CapabilityTokenActiveKeyId": keys["TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID"],
            "CapabilityTokenPublicKeysSecretArn": secret_arn("capability-token-public-keys"),
            "AttemptTokenKeysSecretArn": secret_arn("attempt-token-keys"),
            "AttemptTokenActiveKeyId": bootstrap.DEV_ATTEMPT_KID,
            "QueryDatabaseUrlSecretArn": secret_arn("query-database-url"),
            "DispatcherLeaseTtlSeconds": "10",
        }
        values.update(self.config.platform_parameters)
        return values

    def worker_parameters(self) -> dict[str, str]:
        image = self.config.worker_image or f"localhost/taskplat-worker-base:{self.config.tag}"
        values = {
            "PlatformStackName": STACK_NAME,
            "QueueStackName": QUEUE_STACK,
            "WorkerImage": image,
            "WorkerRepositoryName": "taskplat-worker",
            "WorkerDrainTimeoutSeconds": "30",
            "PlatformDataServices": "true",
        }
        values.update(self.config.worker_parameters)
        return values

    def _worker_definition(
        self, parameters: dict[str, str], imports: dict[str, str]
    ) -> cfn.ContainerDef:
        workers = self._resolve("worker-pool.yaml", parameters, imports)
        (worker,) = [c for c in workers if c.name != COLLECTOR]
        return worker

    def _resolve(
        self, template: str, parameters: dict[str, str], imports: dict[str, str]
    ) -> list[cfn.ContainerDef]:
        document = cfn.load_template(TEMPLATES / template)
        resolver = cfn.Resolver(document, parameters, imports, stack_name=STACK_NAME)
        try:
            return cfn.task_containers(resolver)
        except cfn.TemplateError as exc:
            raise DevstackError(f"deploy/cloudformation/{template}: {exc}") from exc

    # -- containers -------------------------------------------------------------------------

    def _plan(
        self,
        definition: cfn.ContainerDef,
        name: str,
        extra: dict[str, str],
        ports: dict[str, int],
        cap_add: tuple[str, ...] = (),
    ) -> RunPlan:
        secrets = {var: self._podman_secret(arn) for var, arn in definition.secrets.items()}
        host_ports = {port: ports.get(definition.name) or free_port() for port in definition.ports}
        prefix = f"taskplat-{self.stack_id}-{name}"
        return RunPlan(
            container_name=prefix,
            image=definition.image,
            extra_env=extra,
            secrets=secrets,
            host_ports=host_ports,
            volume_names={volume: f"{prefix}-{volume}" for volume in definition.volumes},
            stack_id=self.stack_id,
            cap_add=cap_add,
        )

    def _podman_secret(self, value_from: str) -> str:
        if value_from not in self._podman_secrets:
            if value_from not in self._secret_values:
                raise DevstackError(f"the local stack stores no secret {value_from}")
            slug = value_from.rsplit(":", 1)[-1]
            name = f"taskplat-{self.stack_id}-{slug}"
            subprocess.run(
                [*PODMAN, "secret", "create", name, "-"],
                input=self._secret_values[value_from].encode(),
                capture_output=True,
                check=True,
            )
            self._podman_secrets[value_from] = name
        return self._podman_secrets[value_from]

    def _run(
        self,
        definition: cfn.ContainerDef,
        name: str,
        extra: dict[str, str],
        ports: dict[str, int],
        cap_add: tuple[str, ...] = (),
    ) -> None:
        plan = self._plan(definition, name, extra, ports, cap_add)
        running = Running(definition, plan, started_at=time.monotonic())
        out = subprocess.run(run_args(definition, plan), capture_output=True, text=True)
        if out.returncode != 0:
            raise DevstackError(f"podman run {name} failed: {out.stderr.strip()[-2000:]}")
        with self._lock:
            self.containers[name] = running
        self._follow_logs(name)

    def _follow_logs(self, name: str) -> None:
        running = self.containers[name]
        log = (self.log_dir / f"{name}.log").open("ab")
        argv = [*PODMAN, "logs", "--follow", running.plan.container_name]
        self._loggers.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def _run_migrations(self, definition: cfn.ContainerDef, extra: dict[str, str]) -> None:
        plan = self._plan(definition, MIGRATE, extra, {})
        argv = run_args(definition, plan)
        argv.remove("--detach")
        log = self.log_dir / f"{MIGRATE}.log"
        with log.open("wb") as out:
            code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
        containers.podman("rm", "--force", plan.container_name, check=False)
        if code != 0:
            raise DevstackError(f"the migration task exited {code}:\n{read_tail(log)}")

    def healthy(self, name: str) -> bool:
        running = self.containers[name]
        if running.definition.health is None:
            return self.state(name) == "running"
        return containers.passes_health_check(running.plan.container_name)

    def state(self, name: str) -> str:
        return containers.state(self.containers[name].plan.container_name)

    def wait_all_healthy(self, names: list[str] | None = None) -> None:
        """Run each container's check (every half second) until it passes; record the time."""
        pending = set(names if names is not None else self.containers)
        deadline = time.monotonic() + self.config.healthy_timeout_seconds
        while pending:
            for name in sorted(pending):
                running = self.containers[name]
                if self.healthy(name):
                    running.healthy_after = time.monotonic() - running.started_at
                    pending.discard(name)
                elif self.state(name) not in ("running", "created", "configured"):
                    log = self.log_dir / f"{name}.log"
                    raise DevstackError(f"{name} exited:\n{read_tail(log)}")
            if pending and time.monotonic() > deadline:
                name = sorted(pending)[0]
                raise DevstackError(
                    f"{name} did not become healthy:\n{read_tail(self.log_dir / f'{name}.log')}"
                )
            if pending:
                time.sleep(0.5)

    def supervise(self) -> list[str]:
        """Start again every container that is not running; the names restarted."""
        restarted = []
        with self._lock:
            for name, running in self.containers.items():
                if self.state(name) in ("exited", "stopped"):
                    containers.podman("start", running.plan.container_name, check=False)
                    running.restarts += 1
                    running.started_at = time.monotonic()
                    running.healthy_after = None
                    restarted.append(name)
        for name in restarted:
            self._follow_logs(name)
        return restarted

    def _remove_leftovers(self) -> None:
        """Containers, volumes and secrets of this run directory's stack (an earlier run killed
        before it could clean up included)."""
        containers.remove_stack(self.stack_id)
        self._podman_secrets.clear()
