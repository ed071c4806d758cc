// The example operator of the JavaScript runtime, the same as the Python and Rust ones (the
// shared contract tests run all three): `node operator.mjs` serves the worker wrapper's
// protocol; as a Lambda function its handler is `operator.handler`.
//
// Config: `crash` (exit at once, answering nothing), `print` (a stray line on stdout),
// `sleep_seconds` (then go on), `events` (emitted as given), `forward` (one event on output 0 per
// input, at its cursor), `steps` (names: each step's result is the attempt that first ran it),
// `query` ({sql, params, max_rows}: its answer goes in the payload), `records` ({output, records}:
// published), `event_bytes` (one event on output 0 whose partition_key is that many bytes),
// `fail` / `permanent` (fail with this message, permanently for the latter), `non_finite` ("nan"
// or "inf": a payload holding that number). Payload: {attempt, emitted, inputs (their cursors)}
// plus `steps`, `query`, `published`.
import { pathToFileURL } from "node:url";

import {
  emitEvent,
  PermanentFailure,
  publishRecords,
  query,
  serve,
  step,
  taskplatHandler,
} from "../dist/esm/index.js";

export async function handle(task) {
  const config = task.config;
  if (config.crash) process.exit(3);
  if (config.print) console.log(config.print);
  if (config.sleep_seconds) await new Promise((resolve) => setTimeout(resolve, config.sleep_seconds * 1000));
  const payload = { attempt: task.attempt, emitted: 0, inputs: task.inputs.map((item) => item.cursor ?? null) };
  for (const event of config.events ?? []) {
    await emitEvent(event);
    payload.emitted += 1;
  }
  if (config.event_bytes) {
    await emitEvent({ output_index: 0, partition_key: "x".repeat(config.event_bytes) });
    payload.emitted += 1;
  }
  if (config.forward) {
    for (const item of task.inputs) {
      await emitEvent({ output_index: 0, cursor: item.cursor });
      payload.emitted += 1;
    }
  }
  if (config.steps) {
    payload.steps = {};
    for (const name of config.steps) {
      payload.steps[name] = await step(name, () => task.attempt);
    }
  }
  if (config.query) {
    const { sql, params, max_rows: maxRows } = config.query;
    payload.query = await query(sql, params, { maxRows });
  }
  if (config.records) {
    payload.published = await publishRecords(config.records.output, config.records.records);
  }
  if (config.fail) throw new Error(config.fail);
  if (config.permanent) throw new PermanentFailure(config.permanent);
  if (config.non_finite) return { ratio: config.non_finite === "nan" ? NaN : Infinity };
  return payload;
}

export const handler = taskplatHandler(handle);

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = await serve(handle);
}
