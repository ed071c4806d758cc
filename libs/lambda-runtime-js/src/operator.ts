/**
 * The operator SDK, once for both runtimes: the worker wrapper's (JSON lines on stdin and stdout,
 * `serve`) and Lambda's (`taskplatHandler`). The same contract as the Python and Rust runtimes.
 *
 * Invariants:
 *  - `serve` answers every task line on stdin with exactly one envelope line on stdout, so the
 *    same code runs per-task (one line, then stdin closes) and pooled (a line per task).
 *  - While a handler runs under `serve`, `process.stdout.write` (and so `console.log`) goes to
 *    stderr: a stray log cannot corrupt the protocol; only the SDK writes protocol lines.
 *  - Events, step results and records go to the running operator's channel (kept in an
 *    AsyncLocalStorage, so it follows the handler through its awaits): protocol lines under
 *    `serve`, `/internal/events` and `/internal/steps` calls under Lambda.
 *  - A handler that throws fails the task with `error` = `<Error name>: <message>`;
 *    `OperatorFailure` fails it with just its message; `PermanentFailure` fails it for good
 *    (`"retryable": false`: no retry, Dead at once); a result that is not JSON fails it too.
 *  - `emitEvent({output_index: N, ...})` fills `dataset_uuid` and `dataset_version` from the
 *    task's resolved output N; an index the job does not have fails the task.
 *  - `step(name, fn)` runs `fn` only when no earlier attempt recorded a result for `name`, else
 *    returns the recorded one; the first recorded result of a step wins.
 *  - `publishRecords` is the wrapper's alone (a function has no buffer queue to publish to).
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { createInterface } from "node:readline";
import type { Readable, Writable } from "node:stream";

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** The largest records line `publishRecords` writes (bytes of JSON). */
export const RECORDS_LINE_BYTES = 200_000;

/** Throw to fail the task with this message (no error name in front). */
export class OperatorFailure extends Error {
  constructor(message: string) {
    super(message);
    this.name = "OperatorFailure";
  }
}

/** Throw to fail the task for good: no retry, the task is Dead at once. */
export class PermanentFailure extends OperatorFailure {
  constructor(message: string) {
    super(message);
    this.name = "PermanentFailure";
  }
}

/** One resolved output of the task's job (claimed with the task). */
export interface OutputTarget {
  output_index: number;
  dataset_uuid: string;
  dataset_version: string;
  location?: string;
  dataset?: string | null;
  kind?: string | null;
  [key: string]: Json | undefined;
}

/** The task an operator runs: a wrapper task line, or a Lambda claim's task. */
export class Task {
  readonly taskId: string;
  readonly attempt: number;
  readonly leaseToken: string;
  readonly deadlineAt: string | null;
  readonly operator: string;
  readonly queue: string;
  readonly config: JsonObject;
  readonly inputs: Json[];
  readonly job: JsonObject | null;
  readonly timeoutSeconds: number | null;
  readonly outputs: OutputTarget[];
  /** Step results earlier attempts recorded ({step: result}); `step` adds this attempt's. */
  readonly steps: JsonObject;
  /** The task document as received. */
  readonly document: JsonObject;

  constructor(doc: JsonObject) {
    if (typeof doc.task_id !== "string" || typeof doc.attempt !== "number") {
      throw new OperatorFailure("a task needs task_id and attempt");
    }
    this.document = doc;
    this.taskId = doc.task_id;
    this.attempt = doc.attempt;
    this.leaseToken = String(doc.lease_token ?? "");
    this.deadlineAt = typeof doc.deadline_at === "string" ? doc.deadline_at : null;
    this.operator = String(doc.operator ?? "");
    this.queue = String(doc.queue ?? "");
    this.config = isObject(doc.config) ? doc.config : {};
    this.inputs = Array.isArray(doc.inputs) ? doc.inputs : [];
    this.job = isObject(doc.job) ? doc.job : null;
    this.timeoutSeconds = typeof doc.timeout_seconds === "number" ? doc.timeout_seconds : null;
    this.outputs = (Array.isArray(doc.outputs) ? doc.outputs : []).filter(isObject) as OutputTarget[];
    this.steps = isObject(doc.steps) ? { ...doc.steps } : {};
  }

  /** The resolved output `index` of the task's job. */
  output(index: number): OutputTarget {
    const found = this.outputs.find((output) => output.output_index === index);
    if (found === undefined) {
      const known = this.outputs.map((output) => output.output_index).sort((a, b) => a - b);
      throw new OperatorFailure(`the task's job has no output ${index} (outputs: [${known.join(", ")}])`);
    }
    return found;
  }
}

/** A full result: payload, outputs and final events. */
export interface Result {
  payload?: JsonObject | null;
  outputs?: JsonObject[];
  events?: JsonObject[];
}

/** Mark a full result (so a payload that happens to hold `payload` is not mistaken for one). */
export function result(value: Result): Result {
  return Object.assign(Object.create(resultMarker), value) as Result;
}
const resultMarker = {};

export type Handler = (
  task: Task,
) => Promise<JsonObject | Result | null | undefined | void> | JsonObject | Result | null | undefined | void;

/** Where a running operator's events, steps and records go (the wrapper or the dispatcher). */
export interface Channel {
  events(events: JsonObject[]): Promise<void> | void;
  step(name: string, result: Json): Promise<Json> | Json;
  records?(datasetUuid: string, records: string[]): void;
  /** The capability token for `query` (Lambda: the invocation's), if the channel has one. */
  capabilityToken?: string | null;
}

export type Envelope =
  | { status: "succeeded"; payload: JsonObject | null; outputs?: JsonObject[]; events?: JsonObject[] }
  | { status: "failed"; retryable?: false; error: string };

interface Running {
  task: Task;
  channel: Channel;
}

const running = new AsyncLocalStorage<Running>();

function current(what: string): Running {
  const found = running.getStore();
  if (found === undefined) {
    throw new OperatorFailure(`${what} works only inside a handler run by serve or Lambda`);
  }
  return found;
}

/** The running operator's channel (for `query`), if any. */
export function currentChannel(): Channel | undefined {
  return running.getStore()?.channel;
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The event as the dispatcher takes it: an `output_index` becomes that output's `dataset_uuid`
 * and `dataset_version` (a given `dataset_version` is kept). */
export function resolveEvent(event: JsonObject, task?: Task): JsonObject {
  const { output_index: index, ...rest } = event;
  if (index === undefined || index === null) {
    return { ...rest };
  }
  const owner = task ?? running.getStore()?.task;
  if (owner === undefined) {
    throw new OperatorFailure("output_index needs the task (emit inside a handler run by serve)");
  }
  const output = owner.output(Number(index));
  return {
    dataset_uuid: output.dataset_uuid,
    dataset_version: output.dataset_version,
    ...rest,
  };
}

/** Emit one upstream event: `dataset_uuid` and `dataset_version` (or `output_index`, an output
 * of the task's job), and a `cursor` or a partition (`partition_key`, `start`, `end`). */
export async function emitEvent(event: JsonObject): Promise<void> {
  const { channel } = current("emitting events");
  await channel.events([resolveEvent(event)]);
}

/** Emit several events in one call (one line, or one request). */
export async function emitEvents(events: JsonObject[]): Promise<void> {
  const { channel } = current("emitting events");
  const batch = events.map((event) => resolveEvent(event));
  if (batch.length > 0) {
    await channel.events(batch);
  }
}

/** The result of the task's step `name`: recorded by an earlier attempt, else `fn()` (recorded
 * for later attempts). The result must be JSON. */
export async function step<T extends Json>(name: string, fn: () => T | Promise<T>): Promise<T> {
  const { task, channel } = current("step");
  if (Object.prototype.hasOwnProperty.call(task.steps, name)) {
    return task.steps[name] as T;
  }
  const value = await fn();
  checkJson(value, `step ${JSON.stringify(name)}: the result`);
  const standing = (await channel.step(name, value)) as T;
  task.steps[name] = standing;
  return standing;
}

function buffered(task: Task, output: number | string): OutputTarget {
  let found: OutputTarget | undefined;
  if (typeof output === "number") {
    found = task.output(output);
  } else {
    found = task.outputs.find((each) => each.dataset === output || each.dataset_uuid === output);
    if (found === undefined) {
      throw new OperatorFailure(`the task's job has no output dataset ${JSON.stringify(output)}`);
    }
  }
  if (found.kind !== "buffered_postgres") {
    throw new OperatorFailure(`output ${JSON.stringify(output)} is not a buffered_postgres dataset`);
  }
  return found;
}

/** Publish records to a buffered_postgres output of the task's job (its output index, dataset
 * name or dataset uuid); returns how many. Each record has `org_id` and `dedupe_key`. */
export async function publishRecords(output: number | string, records: Iterable<JsonObject>): Promise<number> {
  const { task, channel } = current("publishRecords");
  const target = buffered(task, output);
  if (channel.records === undefined) {
    throw new OperatorFailure("publish_records works only under the worker wrapper");
  }
  const datasetUuid = String(target.dataset_uuid);
  let chunk: string[] = [];
  let size = 0;
  let count = 0;
  for (const record of records) {
    const text = JSON.stringify(record);
    if (chunk.length > 0 && size + text.length + 1 > RECORDS_LINE_BYTES) {
      channel.records(datasetUuid, chunk);
      chunk = [];
      size = 0;
    }
    chunk.push(text);
    size += text.length + 1;
    count += 1;
  }
  if (chunk.length > 0) {
    channel.records(datasetUuid, chunk);
  }
  return count;
}

function checkJson(value: unknown, what: string): void {
  const seen = (item: unknown): void => {
    if (item === null || typeof item === "string" || typeof item === "boolean") return;
    if (typeof item === "number") {
      if (!Number.isFinite(item)) throw new OperatorFailure(`${what} is not JSON: ${item}`);
      return;
    }
    if (Array.isArray(item)) {
      item.forEach(seen);
      return;
    }
    if (isObject(item)) {
      Object.values(item).forEach(seen);
      return;
    }
    throw new OperatorFailure(`${what} is not JSON: a ${typeof item}`);
  };
  seen(value);
}

function errorText(error: unknown): Envelope {
  if (error instanceof PermanentFailure) {
    return { status: "failed", retryable: false, error: error.message || "operator failed" };
  }
  if (error instanceof OperatorFailure) {
    return { status: "failed", error: error.message || "operator failed" };
  }
  if (error instanceof Error) {
    process.stderr.write(`${error.stack ?? error.message}\n`);
    return { status: "failed", error: `${error.name}: ${error.message}` };
  }
  return { status: "failed", error: `operator failed: ${String(error)}` };
}

/** Run `handler` on `task` with `channel` taking its events and steps; the result envelope,
 * never a rejection. */
export async function runOperator(handler: Handler, task: Task, channel: Channel): Promise<Envelope> {
  let envelope: Envelope;
  try {
    const value = await running.run({ task, channel }, () => Promise.resolve(handler(task)));
    if (value !== null && value !== undefined && Object.getPrototypeOf(value) === resultMarker) {
      const full = value as Result;
      envelope = { status: "succeeded", payload: full.payload ?? null };
      if (full.outputs && full.outputs.length > 0) envelope.outputs = full.outputs;
      if (full.events && full.events.length > 0) {
        envelope.events = full.events.map((event) => resolveEvent(event, task));
      }
    } else if (value === null || value === undefined) {
      envelope = { status: "succeeded", payload: null };
    } else if (isObject(value)) {
      envelope = { status: "succeeded", payload: { ...value } };
    } else {
      throw new OperatorFailure(`the handler returned a ${typeof value}, not an object`);
    }
    checkJson(envelope, "result");
  } catch (error) {
    return errorText(error);
  }
  return envelope;
}

class Lines implements Channel {
  constructor(private readonly write: (line: string) => void) {}

  line(value: unknown): void {
    this.write(`${JSON.stringify(value)}\n`);
  }

  events(events: JsonObject[]): void {
    this.line(events.length === 1 ? { event: events[0] } : { events });
  }

  step(name: string, value: Json): Json {
    this.line({ step: { name, result: value } });
    return value;
  }

  records(datasetUuid: string, records: string[]): void {
    this.write(`{"dataset_uuid":${JSON.stringify(datasetUuid)},"records":[${records.join(",")}]}\n`);
  }
}

export interface ServeOptions {
  stdin?: Readable;
  stdout?: Writable;
}

/** The worker wrapper's side: answer each task line of stdin with one envelope line; resolves
 * to 0 when stdin closes. */
export async function serve(handler: Handler, options: ServeOptions = {}): Promise<number> {
  const input = options.stdin ?? process.stdin;
  const output = options.stdout ?? process.stdout;
  const realWrite = output.write.bind(output);
  const stdoutWrite = process.stdout.write;
  const channel = new Lines((line) => {
    realWrite(line);
  });
  if (output === process.stdout) {
    // A stray console.log goes to stderr while the operator serves.
    process.stdout.write = process.stderr.write.bind(process.stderr) as typeof process.stdout.write;
  }
  try {
    const lines = createInterface({ input, crlfDelay: Infinity });
    for await (const line of lines) {
      if (line.trim() === "") continue;
      let envelope: Envelope;
      try {
        envelope = await runOperator(handler, new Task(JSON.parse(line) as JsonObject), channel);
      } catch (error) {
        envelope = errorText(error);
      }
      channel.line(envelope);
    }
  } finally {
    process.stdout.write = stdoutWrite;
  }
  return 0;
}
