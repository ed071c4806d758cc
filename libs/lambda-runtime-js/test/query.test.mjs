// `query()` carries the running task's W3C trace context to the query service (a real local HTTP
// server records the request): the task line's `traceparent`, else `TRACEPARENT`, and no header
// for an untraced task.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { query, runOperator, Task } from "../dist/esm/index.js";

const TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const ANSWER = { columns: [], rows: [], row_count: 0, truncated: false, elapsed_ms: 1 };

function task(fields) {
  return new Task({
    task_id: "t-1", attempt: 1, lease_token: "l-1", operator: "op", queue: "default",
    config: {}, inputs: [], job: null, timeout_seconds: null, deadline_at: null, outputs: [],
    ...fields,
  });
}

async function headersOfOneQuery(fields) {
  const seen = [];
  const server = createServer((request, response) => {
    seen.push(request.headers);
    request.resume();
    request.on("end", () => {
      response.writeHead(200, { "Content-Type": "application/json" });
      response.end(JSON.stringify(ANSWER));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  process.env.TASKPLAT_QUERY_URL = `http://127.0.0.1:${server.address().port}`;
  const channel = { events() {}, step: (_name, result) => result, capabilityToken: "token" };
  try {
    const envelope = await runOperator(async () => ({ rows: (await query("SELECT 1")).row_count }), task(fields), channel);
    assert.equal(envelope.status, "succeeded", JSON.stringify(envelope));
  } finally {
    server.close();
  }
  return seen;
}

test("the task line's traceparent goes with the query", async () => {
  const seen = await headersOfOneQuery({ traceparent: TRACEPARENT });
  assert.deepEqual(seen.map((headers) => headers.traceparent), [TRACEPARENT]);
});

test("an untraced task sends no trace header", async () => {
  delete process.env.TRACEPARENT;
  const seen = await headersOfOneQuery({});
  assert.equal(seen.length, 1);
  assert.equal(seen[0].traceparent, undefined);
});
