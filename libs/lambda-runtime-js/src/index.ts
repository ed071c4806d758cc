/**
 * The Taskplat operator runtime for TypeScript and JavaScript: one handler for the worker
 * wrapper (`serve`, JSON lines on stdin/stdout) and for AWS Lambda (`taskplatHandler`, the
 * attempt token only). No runtime dependencies (Node 20's fetch).
 *
 *     import { emitEvent, serve, taskplatHandler, type Task } from "@taskplat/lambda-runtime";
 *
 *     async function handle(task: Task) {
 *       await emitEvent({ output_index: 0, cursor: 42 });
 *       return { rows: 42 };
 *     }
 *     export const handler = taskplatHandler(handle);   // Lambda
 *     // or, as an operators.yaml command: await serve(handle);
 */
export {
  checkTaskLine,
  emitEvent,
  emitEvents,
  EVENT_MAX_BYTES,
  OperatorFailure,
  PermanentFailure,
  publishRecords,
  RECORDS_LINE_BYTES,
  resolveEvent,
  result,
  runOperator,
  serve,
  step,
  Task,
} from "./operator.js";
export type {
  Channel,
  Envelope,
  Event,
  Handler,
  JobRef,
  Json,
  JsonObject,
  Output,
  OutputTarget,
  Result,
  ResultEnvelope,
  ServeOptions,
  TaskLine,
  Trust,
} from "./operator.js";
export { Refused, Unreachable } from "./dispatcher.js";
export { LeaseLost, taskplatHandler } from "./lambda.js";
export type { HandlerOptions, LambdaContext, LambdaHandler } from "./lambda.js";
export { query, QueryError } from "./query.js";
export type { QueryColumn, QueryOptions, QueryResult } from "./query.js";
