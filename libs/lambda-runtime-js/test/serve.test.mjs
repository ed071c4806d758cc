// The worker wrapper's protocol of the example operator (a child process, as the wrapper runs
// it), and both builds of the package: ESM and CommonJS export the same names.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import * as esm from "../dist/esm/index.js";

const here = dirname(fileURLToPath(import.meta.url));
const operator = join(here, "..", "examples", "operator.mjs");
const output = { output_index: 0, dataset_uuid: "d-1", dataset_version: "v-1", location: "x" };

/** A task line with every required field (the contracts' `TaskLine` schema). */
function taskLine(fields) {
  return {
    task_id: "t-1",
    attempt: 2,
    lease_token: "l-1",
    operator: "op",
    queue: "default",
    config: {},
    inputs: [],
    job: null,
    timeout_seconds: null,
    deadline_at: null,
    outputs: [output],
    ...fields,
  };
}

function serve(...configs) {
  const lines = configs.map((config) =>
    JSON.stringify(taskLine({ config })),
  );
  const run = spawnSync(process.execPath, [operator], { input: `${lines.join("\n\n")}\n`, encoding: "utf8" });
  assert.equal(run.status, 0, run.stderr);
  return { lines: run.stdout.split("\n").filter(Boolean).map((line) => JSON.parse(line)), stderr: run.stderr };
}

test("serve answers each task line with one envelope; a stray print goes to stderr", () => {
  const { lines, stderr } = serve({ print: "stray", events: [{ output_index: 0, cursor: 2 }] }, { fail: "boom" });
  assert.deepEqual(lines, [
    { event: { dataset_uuid: "d-1", dataset_version: "v-1", cursor: 2 } },
    { status: "succeeded", payload: { attempt: 2, emitted: 1, inputs: [] } },
    { status: "failed", error: "Error: boom" },
  ]);
  assert.match(stderr, /^stray$/m);
});

test("steps, a permanent failure and an unknown output", () => {
  const { lines } = serve({ steps: ["a"] }, { permanent: "never again" }, { events: [{ output_index: 5, cursor: 1 }] });
  assert.deepEqual(lines, [
    { step: { name: "a", result: 2 } },
    { status: "succeeded", payload: { attempt: 2, emitted: 0, inputs: [], steps: { a: 2 } } },
    { status: "failed", retryable: false, error: "never again" },
    { status: "failed", error: "the task's job has no output 5 (outputs: [0])" },
  ]);
});

test("a recorded step is neither run nor recorded again", async () => {
  const task = new esm.Task(taskLine({ attempt: 3, steps: { a: 1 } }));
  const seen = [];
  const channel = { events: () => {}, step: (name, value) => (seen.push(name), value) };
  const envelope = await esm.runOperator(async () => ({ a: await esm.step("a", () => 99) }), task, channel);
  assert.deepEqual(envelope, { status: "succeeded", payload: { a: 1 } });
  assert.deepEqual(seen, []);
});

test("the SDK refuses outside a handler, and records under Lambda", async () => {
  await assert.rejects(esm.emitEvent({ cursor: 1 }), esm.OperatorFailure);
  const task = new esm.Task(taskLine({ attempt: 1, outputs: [{ ...output, kind: "buffered_postgres" }] }));
  const lambdaLike = { events: () => {}, step: (_name, value) => value };
  const envelope = await esm.runOperator(
    () => esm.publishRecords(0, [{ org_id: "o", dedupe_key: "k" }]).then(() => ({})),
    task,
    lambdaLike,
  );
  assert.deepEqual(envelope, { status: "failed", error: "publish_records works only under the worker wrapper" });
});

test("a task is made of a task line only", () => {
  assert.throws(() => new esm.Task({ task_id: "t", attempt: 1 }), {
    name: "OperatorFailure",
    message: "malformed task line: lease_token must be a string",
  });
  assert.throws(() => new esm.Task(taskLine({ attempt: 1.5 })), { message: "malformed task line: attempt must be an integer" });
  assert.throws(() => new esm.Task(taskLine({ outputs: [{ output_index: 0 }] })), {
    message: "malformed task line: outputs[0].dataset_uuid must be a string",
  });
  assert.equal(esm.checkTaskLine(taskLine({})), null);
});

test("the CommonJS build exports what the ES module build does", () => {
  const cjs = createRequire(import.meta.url)("../dist/cjs/index.js");
  assert.deepEqual(Object.keys(cjs).sort(), Object.keys(esm).sort());
  assert.equal(typeof cjs.taskplatHandler, "function");
  assert.ok(new cjs.PermanentFailure("x") instanceof cjs.OperatorFailure);
});
