/**
 * The operator SDK, once for both runtimes: the worker wrapper's (JSON lines on stdin and stdout,
 * `serve`) and Lambda's (`taskplatHandler`). The same contract as the Python and Rust runtimes.
 *
 * Invariants:
 *  - `serve` answers every task line on stdin with exactly one envelope line on stdout, so the
 *    same code runs per-task (one line, then stdin closes) and pooled (a line per task). A line
 *    that is not a task (not JSON, or not the shape of the contracts' `TaskLine` schema, whose
 *    generated type is `TaskLine`) answers a failed envelope, `malformed task line: ...`, and
 *    serving goes on. When stdout is closed under it (the reader went away), serving stops at
 *    once: no further task runs and `serve` resolves to 1.
 *  - While a handler runs under `serve`, `process.stdout.write` (and so `console.log`) goes to
 *    stderr: a stray log cannot corrupt the protocol; only the SDK writes protocol lines.
 *  - Events, step results and records go to the running operator's channel (kept in an
 *    AsyncLocalStorage, so it follows the handler through its awaits): protocol lines under
 *    `serve`, `/internal/events` and `/internal/steps` calls under Lambda.
 *  - A handler that throws fails the task with `error` = `<Error name>: <message>`;
 *    `OperatorFailure` fails it with just its message; `PermanentFailure` fails it for good
 *    (`"retryable": false`: no retry, Dead at once); a result that is not JSON fails it too,
 *    NaN and Infinity included: `the result is not JSON: NaN or Infinity`.
 *  - `emitEvent({output_index: N, ...})` fills `dataset_uuid` and `dataset_version` from the
 *    task's resolved output N; an index the job does not have, or an event over
 *    `EVENT_MAX_BYTES` of JSON, fails the task before the event is written.
 *  - `step(name, fn)` runs `fn` only when no earlier attempt recorded a result for `name`, else
 *    returns the recorded one; the first recorded result of a step wins.
 *  - `publishRecords` is the wrapper's alone (a function has no buffer queue to publish to).
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { createInterface } from "node:readline";
import type { Readable, Writable } from "node:stream";

import type { OutputTarget, ResultEnvelope, TaskLine } from "./contract.js";

export type { Event, JobRef, Output, OutputTarget, ResultEnvelope, TaskLine, Trust } from "./contract.js";

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** The largest records line `publishRecords` writes (bytes of JSON). */
export const RECORDS_LINE_BYTES = 200_000;

/** The largest event, in bytes of JSON once resolved (the same in the three runtimes). */
export const EVENT_MAX_BYTES = 16_384;

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

type Kind = "string" | "integer" | "object" | "array";

// The task line's fields and JSON types, as the contracts' `TaskLine` schema states them (the
// generated `TaskLine` type, and the Python and Rust runtimes, read the same): required, then
// optional (absent or null).
const REQUIRED: [string, Kind][] = [
  ["task_id", "string"],
  ["attempt", "integer"],
  ["lease_token", "string"],
  ["operator", "string"],
  ["queue", "string"],
  ["config", "object"],
  ["inputs", "array"],
];
const OPTIONAL: [string, Kind][] = [
  ["job", "object"],
  ["timeout_seconds", "integer"],
  ["deadline_at", "string"],
  ["outputs", "array"],
  ["steps", "object"],
  ["trust", "string"],
  ["traceparent", "string"],
  ["tracestate", "string"],
];
const OUTPUT_REQUIRED: [string, Kind][] = [
  ["output_index", "integer"],
  ["dataset_uuid", "string"],
  ["dataset_version", "string"],
  ["location", "string"],
];
const KIND_NAMES: Record<Kind, string> = {
  string: "a string",
  integer: "an integer",
  object: "an object",
  array: "an array",
};

function isKind(value: unknown, kind: Kind): boolean {
  if (kind === "string") return typeof value === "string";
  if (kind === "integer") return Number.isInteger(value);
  if (kind === "array") return Array.isArray(value);
  return isObject(value);
}

function fieldsProblem(doc: JsonObject, required: [string, Kind][], optional: [string, Kind][], where: string): string | null {
  for (const [name, kind] of required) {
    if (!isKind(doc[name], kind)) return `${where}${name} must be ${KIND_NAMES[kind]}`;
  }
  for (const [name, kind] of optional) {
    const value = doc[name];
    if (value !== undefined && value !== null && !isKind(value, kind)) return `${where}${name} must be ${KIND_NAMES[kind]}`;
  }
  return null;
}

/** Why `doc` is not a task line (null when it is one). */
export function checkTaskLine(doc: unknown): string | null {
  if (!isObject(doc)) return "a task line is a JSON object";
  const problem = fieldsProblem(doc, REQUIRED, OPTIONAL, "");
  if (problem !== null) return problem;
  if (![undefined, null, "trusted", "untrusted"].includes(doc.trust as string)) {
    return "trust must be trusted or untrusted";
  }
  if (isObject(doc.job)) {
    const job = fieldsProblem(doc.job, [["dag_name", "string"], ["name", "string"]], [], "job.");
    if (job !== null) return job;
  }
  const outputs = Array.isArray(doc.outputs) ? doc.outputs : [];
  for (const [index, output] of outputs.entries()) {
    if (!isObject(output)) return `outputs[${index}] must be an object`;
    const wrong = fieldsProblem(output, OUTPUT_REQUIRED, [], `outputs[${index}].`);
    if (wrong !== null) return wrong;
  }
  return null;
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
  /** The task line as received (its type is generated from the contracts' JSON Schema). */
  readonly document: TaskLine;

  /** The task of a task line; `OperatorFailure` (`malformed task line: ...`) when it is none. */
  constructor(doc: unknown) {
    const problem = checkTaskLine(doc);
    if (problem !== null) {
      throw new OperatorFailure(`malformed task line: ${problem}`);
    }
    const line = doc as TaskLine;
    this.document = line;
    this.taskId = line.task_id;
    this.attempt = line.attempt;
    this.leaseToken = line.lease_token;
    this.deadlineAt = line.deadline_at ?? null;
    this.operator = line.operator;
    this.queue = line.queue;
    this.config = line.config as JsonObject;
    this.inputs = line.inputs as Json[];
    this.job = (line.job ?? null) as JsonObject | null;
    this.timeoutSeconds = line.timeout_seconds ?? null;
    this.outputs = line.outputs ?? [];
    this.steps = { ...((line.steps ?? {}) as JsonObject) };
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

/** The result envelope (its type is generated from the contracts' JSON Schema). */
export type Envelope = ResultEnvelope;

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

/** The running task's W3C trace context (for `query`), if it has one. */
export function currentTraceparent(): string | undefined {
  return running.getStore()?.task.document.traceparent ?? undefined;
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The event as the dispatcher takes it: an `output_index` becomes that output's `dataset_uuid`
 * and `dataset_version` (a given `dataset_version` is kept). */
export function resolveEvent(event: JsonObject, task?: Task): JsonObject {
  const { output_index: index, ...rest } = event;
  if (index === undefined || index === null) {
    return sized({ ...rest });
  }
  const owner = task ?? running.getStore()?.task;
  if (owner === undefined) {
    throw new OperatorFailure("output_index needs the task (emit inside a handler run by serve)");
  }
  const output = owner.output(Number(index));
  return sized({
    dataset_uuid: output.dataset_uuid,
    dataset_version: output.dataset_version,
    ...rest,
  });
}

function sized(event: JsonObject): JsonObject {
  checkJson(event, "an event");
  if (Buffer.byteLength(JSON.stringify(event)) > EVENT_MAX_BYTES) {
    throw new OperatorFailure(`an event is larger than ${EVENT_MAX_BYTES} bytes of JSON`);
  }
  return event;
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
      if (!Number.isFinite(item)) throw new OperatorFailure(`${what} is not JSON: NaN or Infinity`);
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
      if (full.outputs && full.outputs.length > 0) envelope.outputs = full.outputs as unknown as ResultEnvelope["outputs"];
      if (full.events && full.events.length > 0) {
        envelope.events = full.events.map((event) => resolveEvent(event, task)) as unknown as ResultEnvelope["events"];
      }
    } else if (value === null || value === undefined) {
      envelope = { status: "succeeded", payload: null };
    } else if (isObject(value)) {
      envelope = { status: "succeeded", payload: { ...value } };
    } else {
      throw new OperatorFailure(`the handler returned a ${typeof value}, not an object`);
    }
    checkJson(envelope, "the result");
  } catch (error) {
    return errorText(error);
  }
  return envelope;
}

/** The protocol stream was closed under the operator (the reader went away). */
class StreamClosed extends OperatorFailure {
  constructor(cause: unknown) {
    super(`stdout is closed: ${cause instanceof Error ? cause.message : String(cause)}`);
    this.name = "StreamClosed";
  }
}

class Lines implements Channel {
  closed: StreamClosed | null = null;

  /** `send` is the stream's own write (kept when `process.stdout.write` is pointed at stderr). */
  constructor(
    output: Writable,
    private readonly send: (text: string, done: (error?: Error | null) => void) => unknown,
  ) {
    // A write into a closed pipe errors asynchronously: remember it, never crash on it.
    output.on("error", (error) => {
      this.closed ??= new StreamClosed(error);
    });
  }

  /** Write one line; resolves once the stream took it, rejects when the stream is closed. */
  write(text: string): Promise<void> {
    if (this.closed !== null) return Promise.reject(this.closed);
    return new Promise((resolve, reject) => {
      this.send(text, (error) => {
        if (error) {
          this.closed ??= new StreamClosed(error);
          reject(this.closed);
        } else {
          resolve();
        }
      });
    });
  }

  line(value: unknown): Promise<void> {
    return this.write(`${JSON.stringify(value)}\n`);
  }

  events(events: JsonObject[]): Promise<void> {
    return this.line(events.length === 1 ? { event: events[0] } : { events });
  }

  async step(name: string, value: Json): Promise<Json> {
    await this.line({ step: { name, result: value } });
    return value;
  }

  records(datasetUuid: string, records: string[]): void {
    this.write(`{"dataset_uuid":${JSON.stringify(datasetUuid)},"records":[${records.join(",")}]}\n`).catch(() => {
      // `closed` is set: the envelope's write reports it
    });
  }
}

export interface ServeOptions {
  stdin?: Readable;
  stdout?: Writable;
}

/** The worker wrapper's side: answer each task line of stdin with one envelope line; resolves
 * to 0 when stdin closes, 1 when stdout was closed under it. */
export async function serve(handler: Handler, options: ServeOptions = {}): Promise<number> {
  const input = options.stdin ?? process.stdin;
  const output = options.stdout ?? process.stdout;
  const stdoutWrite = process.stdout.write;
  const send = output.write.bind(output) as (text: string, done: (error?: Error | null) => void) => unknown;
  const channel = new Lines(output, send);
  if (output === process.stdout) {
    // A stray console.log goes to stderr while the operator serves (the protocol keeps `send`).
    process.stdout.write = process.stderr.write.bind(process.stderr) as typeof process.stdout.write;
  }
  const lines = createInterface({ input, crlfDelay: Infinity });
  try {
    for await (const line of lines) {
      if (line.trim() === "") continue;
      let envelope: Envelope;
      try {
        envelope = await runOperator(handler, new Task(parseLine(line)), channel);
      } catch (error) {
        envelope = errorText(error);
      }
      await channel.line(envelope);
    }
  } catch (error) {
    if (!(error instanceof StreamClosed)) throw error;
    process.stderr.write(`taskplat: ${error.message}: serving stops\n`);
    lines.close();
    input.destroy();
    return 1;
  } finally {
    process.stdout.write = stdoutWrite;
  }
  return 0;
}

function parseLine(line: string): unknown {
  try {
    return JSON.parse(line);
  } catch (error) {
    throw new OperatorFailure(`malformed task line: ${error instanceof Error ? error.message : String(error)}`);
  }
}
