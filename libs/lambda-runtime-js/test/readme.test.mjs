// The README's operator runs: its code block is written beside the tests (importing the package by
// its own name) and run with a channel that records what it sends, against a small Query Service.
import assert from "node:assert/strict";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

import { runOperator, Task } from "@taskplat/lambda-runtime";

const here = dirname(fileURLToPath(import.meta.url));

test("the README's operator counts, records its step and emits", async (t) => {
  const readme = readFileSync(join(here, "..", "README.md"), "utf8");
  const code = readme.match(/```js\n([\s\S]*?)```/)[1];
  const file = join(here, "readme-operator.generated.mjs");
  writeFileSync(file, code);
  t.after(() => rmSync(file, { force: true }));
  const asked = [];
  const server = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => (body += chunk));
    request.on("end", () => {
      asked.push({ path: request.url, auth: request.headers.authorization, body: JSON.parse(body) });
      response.setHeader("Content-Type", "application/json");
      response.end(JSON.stringify({ columns: [{ name: "count", type: "BIGINT" }], rows: [[5]], row_count: 1, truncated: false, elapsed_ms: 3 }));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => server.close());
  process.env.TASKPLAT_QUERY_URL = `http://127.0.0.1:${server.address().port}`;
  process.env.TASKPLAT_CAPABILITY_TOKEN = "capability";

  const { handle } = await import(pathToFileURL(file).href);
  const sent = [];
  const channel = { events: (events) => sent.push({ events }), step: (name, value) => (sent.push({ step: name, value }), value) };
  const line = {
    task_id: "t-1",
    attempt: 1,
    lease_token: "l-1",
    operator: "count",
    queue: "default",
    config: {},
    inputs: [{ cursor: 9 }],
    job: null,
    timeout_seconds: null,
    deadline_at: null,
    outputs: [{ output_index: 0, dataset_uuid: "d", dataset_version: "v", location: "x" }],
  };
  const task = new Task(line);
  assert.deepEqual(await runOperator(handle, task, channel), { status: "succeeded", payload: { rows: 5 } });
  assert.deepEqual(sent, [
    { step: "count", value: 5 },
    { events: [{ dataset_uuid: "d", dataset_version: "v", cursor: 9 }] },
  ]);
  assert.deepEqual(asked, [
    {
      path: "/query",
      auth: "Bearer capability",
      body: { sql: "select count(*) from blocks where number <= ?", params: [9], format: "json" },
    },
  ]);
  const empty = new Task({ ...line, task_id: "t-2", inputs: [] });
  assert.deepEqual(await runOperator(handle, empty, channel), {
    status: "failed",
    retryable: false,
    error: "nothing to count",
  });
});
