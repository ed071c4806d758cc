/**
 * `taskplatHandler(handle)`: the Lambda handler of a Taskplat operator (Node.js runtimes).
 *
 * The event is the claim made on the function's behalf (`task`, `attempt`, `lease_token`,
 * `lease_expires_at`, `attempt_token`, and `capability_token` for untrusted jobs). The
 * dispatcher's URL is the function's `TASKPLAT_DISPATCHER_URL`; the function holds no worker
 * token and no database credentials, only the attempt token of the attempt it was invoked for.
 *
 * Invariants (the same as the Python and Rust runtimes):
 *  - the first call is a heartbeat, and nothing runs before it answered: an invocation whose
 *    claim never committed, a duplicate invocation, a canceled or an expired attempt is refused
 *    there and runs no operator code (answer `{"status": "Refused", "reason", task_id, attempt}`);
 *  - while the operator runs, a heartbeat every third of the lease keeps the attempt; a refused
 *    heartbeat means the attempt was taken away: its events are refused at once;
 *  - events go to `/internal/events` as they are emitted, step results to `/internal/steps`;
 *  - the completion is sent once: `Completed` with the result, or `Failed` with the error
 *    (`retryable: false` for a `PermanentFailure`), or `Failed` "timed out" when the operator has
 *    not finished `margin` seconds before the earlier of the function's limit and the attempt's
 *    deadline; the process then exits after reporting, so no abandoned code runs on into a later
 *    invocation of the sandbox;
 *  - the handler never throws for an operator's failure; it returns what happened.
 */
import { AttemptApi, Refused, Unreachable } from "./dispatcher.js";
import {
  OperatorFailure,
  runOperator,
  Task,
  type Channel,
  type Envelope,
  type Handler,
  type Json,
  type JsonObject,
} from "./operator.js";

export const URL_ENV = "TASKPLAT_DISPATCHER_URL";
export const MARGIN_ENV = "TASKPLAT_LAMBDA_MARGIN_SECONDS";
export const DEFAULT_MARGIN_SECONDS = 2;
const MAX_HEARTBEAT_INTERVAL = 20;

/** The part of Lambda's context object the handler uses. */
export interface LambdaContext {
  getRemainingTimeInMillis(): number;
}

/** The attempt no longer holds the task: its events and completion are refused. */
export class LeaseLost extends OperatorFailure {
  constructor(message: string) {
    super(message);
    this.name = "LeaseLost";
  }
}

export interface HandlerOptions {
  dispatcherUrl?: string;
  marginSeconds?: number;
}

export type LambdaHandler = (event: JsonObject, context: LambdaContext) => Promise<JsonObject>;

function log(event: string, fields: JsonObject): void {
  process.stderr.write(`${JSON.stringify({ event, ...fields })}\n`);
}

function secondsUntil(when: Json | undefined): number | null {
  if (typeof when !== "string" || when === "") return null;
  const at = Date.parse(when);
  return Number.isNaN(at) ? null : (at - Date.now()) / 1000;
}

/** A third of the lease the dispatcher just granted (bounded). */
function interval(answer: JsonObject): number {
  const left = secondsUntil(answer.lease_expires_at);
  if (left === null) return 5;
  return Math.max(0.5, Math.min(MAX_HEARTBEAT_INTERVAL, left / 3));
}

class Invocation implements Channel {
  readonly task: Task;
  readonly api: AttemptApi;
  readonly capabilityToken: string | null;
  leaseLost = false;
  private readonly started = Date.now();
  private readonly deadlineLeft: number | null;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    event: JsonObject,
    private readonly context: LambdaContext,
    private readonly operator: Handler,
    url: string,
    private readonly margin: number,
  ) {
    const claimed = event.task;
    if (typeof claimed !== "object" || claimed === null || Array.isArray(claimed)) {
      throw new Error("the event is not a Taskplat claim: it has no task");
    }
    if (typeof event.attempt_token !== "string" || typeof event.lease_token !== "string") {
      throw new Error("the event is not a Taskplat claim: no attempt_token or lease_token");
    }
    this.task = new Task({ ...claimed, lease_token: event.lease_token });
    this.deadlineLeft = secondsUntil(this.task.deadlineAt ?? undefined);
    this.capabilityToken = typeof event.capability_token === "string" ? event.capability_token : null;
    this.api = new AttemptApi(
      url,
      event.attempt_token,
      { task_id: this.task.taskId, attempt: this.task.attempt, lease_token: this.task.leaseToken },
      () => this.secondsLeft(),
    );
  }

  /** Time left before the earlier of the function's limit and the attempt's deadline. */
  secondsLeft(): number {
    let left = this.context.getRemainingTimeInMillis() / 1000;
    if (this.deadlineLeft !== null) {
      left = Math.min(left, this.deadlineLeft - (Date.now() - this.started) / 1000);
    }
    return left;
  }

  async events(events: JsonObject[]): Promise<void> {
    if (this.leaseLost) throw new LeaseLost("the attempt lost its lease; its events are refused");
    try {
      await this.api.events(events);
    } catch (error) {
      if (error instanceof Refused) {
        this.leaseLost = true;
        throw new LeaseLost(`events refused: ${error.reason}`);
      }
      throw error;
    }
  }

  async step(name: string, result: Json): Promise<Json> {
    if (this.leaseLost) throw new LeaseLost("the attempt lost its lease; its steps are refused");
    try {
      return await this.api.step(name, result);
    } catch (error) {
      if (error instanceof Refused) {
        this.leaseLost = true;
        throw new LeaseLost(`step refused: ${error.reason}`);
      }
      throw error;
    }
  }

  private beat(seconds: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.api.heartbeat().then(
        (answer) => this.beat(interval(answer)),
        (error: unknown) => {
          if (error instanceof Refused) {
            this.leaseLost = true;
            log("taskplat_lease_lost", { task_id: this.task.taskId, reason: error.reason });
            return;
          }
          log("taskplat_heartbeat_failed", { task_id: this.task.taskId, error: String(error) });
          this.beat(seconds);
        },
      );
    }, seconds * 1000);
  }

  async run(): Promise<JsonObject> {
    const fence = { task_id: this.task.taskId, attempt: this.task.attempt };
    let first: JsonObject;
    try {
      first = await this.api.heartbeat();
    } catch (error) {
      if (error instanceof Refused) {
        log("taskplat_invocation_refused", { ...fence, reason: error.reason });
        return { status: "Refused", reason: error.reason, ...fence };
      }
      log("taskplat_dispatcher_unreachable", { ...fence, error: String(error) });
      return { status: "Unreachable", ...fence };
    }
    this.beat(interval(first));
    let timeout: NodeJS.Timeout | undefined;
    const timedOut = new Promise<null>((resolve) => {
      timeout = setTimeout(() => resolve(null), Math.max(0, this.secondsLeft() - this.margin) * 1000);
    });
    const finished = await Promise.race([runOperator(this.operator, this.task, this), timedOut]);
    clearTimeout(timeout);
    let outcome: Envelope;
    if (finished === null) {
      const left = Math.max(0, this.secondsLeft());
      outcome = {
        status: "failed",
        error: `timed out: the operator was still running ${left.toFixed(1)}s before the function's time limit`,
      };
    } else {
      outcome = finished;
    }
    this.stopped = true;
    clearTimeout(this.timer);
    let answer: JsonObject;
    try {
      answer = await this.complete(outcome);
    } catch (error) {
      if (error instanceof Refused) {
        log("taskplat_completion_refused", { ...fence, reason: error.reason });
        answer = { status: "Refused", reason: error.reason };
      } else if (error instanceof Unreachable) {
        log("taskplat_dispatcher_unreachable", { ...fence, error: error.message });
        answer = { status: "Unreachable" };
      } else {
        throw error;
      }
    }
    const result: JsonObject = {
      status: answer.status ?? null,
      outcome: outcome.status === "succeeded" ? "Completed" : "Failed",
      ...fence,
    };
    if (answer.task_status !== undefined) result.task_status = answer.task_status;
    log("taskplat_attempt_reported", result);
    if (finished === null) {
      // The abandoned operator must not run on into the next invocation of this sandbox.
      process.exit(0);
    }
    return result;
  }

  private complete(outcome: Envelope): Promise<JsonObject> {
    if (outcome.status === "succeeded") {
      return this.api.complete("Completed", {
        result: (outcome.payload ?? null) as Json,
        outputs: (outcome.outputs ?? null) as Json,
        events: (outcome.events ?? null) as Json,
      });
    }
    const error = (outcome.error || "operator failed").slice(0, 16_000);
    if (outcome.retryable === false) {
      return this.api.complete("Failed", { error_message: error, retryable: false });
    }
    return this.api.complete("Failed", { error_message: error });
  }
}

/** The Lambda handler that runs `handle` for the attempt in its event. */
export function taskplatHandler(handle: Handler, options: HandlerOptions = {}): LambdaHandler {
  return async (event, context) => {
    const url = options.dispatcherUrl ?? process.env[URL_ENV];
    if (!url) {
      throw new Error(`${URL_ENV} is not set: the function cannot reach the dispatcher`);
    }
    const margin = options.marginSeconds ?? Number(process.env[MARGIN_ENV] || DEFAULT_MARGIN_SECONDS);
    return new Invocation(event, context, handle, url, margin).run();
  };
}
