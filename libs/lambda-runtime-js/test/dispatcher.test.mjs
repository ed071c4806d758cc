// The Lambda handler against a real dispatcher: TASKPLAT_TEST_DISPATCHER_URL, _API_KEY and
// _WORKER_TOKEN name it (tests/runtimes/test_runtime_js.py starts one and runs this file). The
// test claims a task as the relay would for a function, then invokes the handler with the claim.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { handle } from "../examples/operator.mjs";
import { taskplatHandler } from "../dist/esm/index.js";

const url = process.env.TASKPLAT_TEST_DISPATCHER_URL;
const apiKey = process.env.TASKPLAT_TEST_API_KEY;
const workerToken = process.env.TASKPLAT_TEST_WORKER_TOKEN;
const skip = url ? false : "TASKPLAT_TEST_DISPATCHER_URL is not set (tests/runtimes/test_runtime_js.py sets it)";
const dag = `js-${randomUUID().slice(0, 8)}`;
const context = { getRemainingTimeInMillis: () => 30_000 };
const handler = taskplatHandler(handle, { dispatcherUrl: url });

async function call(method, path, token, body) {
  const response = await fetch(url + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

async function claimedRun(config, extra = {}) {
  const run = await call("POST", `/dags/${dag}/jobs/emit/runs`, apiKey, { config, ...extra });
  assert.equal(run.status, 201, JSON.stringify(run.body));
  const claim = await call("POST", "/internal/task-claim", workerToken, {
    task_id: run.body.task_id,
    worker_id: "js-runtime-test",
  });
  assert.equal(claim.body.status, "Claimed", JSON.stringify(claim.body));
  return claim.body;
}

async function task(taskId) {
  return (await call("GET", `/tasks/${taskId}`, apiKey)).body;
}

test("the Lambda handler runs a claimed attempt against the dispatcher", { skip }, async (t) => {
  const applied = await call("PUT", `/dags/${dag}`, apiKey, {
    jobs: { emit: { operator: "js", max_attempts: 3, outputs: [{ index: 0, dataset: `${dag}-out` }] } },
  });
  assert.equal(applied.status, 201, JSON.stringify(applied.body));

  await t.test("events, steps and the completion go through with the attempt token", async () => {
    const claim = await claimedRun({ events: [{ output_index: 0, cursor: 7 }], steps: ["once"] });
    const answer = await handler(claim, context);
    const taskId = claim.task.task_id;
    assert.deepEqual(answer, {
      status: "Accepted",
      outcome: "Completed",
      task_id: taskId,
      attempt: 1,
      task_status: "Completed",
    });
    const done = await task(taskId);
    assert.equal(done.status, "Completed");
    assert.deepEqual(done.result, { attempt: 1, emitted: 1, inputs: [], steps: { once: 1 } });
    const events = (await call("GET", `/tasks/${taskId}/events`, apiKey)).body.events;
    assert.deepEqual(
      events.map((event) => [event.cursor, event.producer.attempt]),
      [[7, 1]],
    );
    // The same invocation delivered again is refused at its first heartbeat and runs nothing.
    const again = await handler(claim, context);
    assert.equal(again.status, "Refused");
    assert.equal(again.reason, "NotRunning");
  });

  await t.test("a canceled attempt is refused before the operator runs", async () => {
    const claim = await claimedRun({ crash: true });
    const canceled = await call("PUT", `/tasks/${claim.task.task_id}/cancel`, apiKey);
    assert.equal(canceled.status, 200, JSON.stringify(canceled.body));
    const answer = await handler(claim, context);
    assert.deepEqual(answer, { status: "Refused", reason: "Canceled", task_id: claim.task.task_id, attempt: 1 });
  });

  await t.test("a permanent failure makes the task Dead at once", async () => {
    const claim = await claimedRun({ permanent: "the input can never be read" });
    const answer = await handler(claim, context);
    assert.equal(answer.outcome, "Failed");
    assert.equal(answer.task_status, "Dead");
    const dead = await task(claim.task.task_id);
    assert.equal(dead.status, "Dead");
    assert.match(dead.last_error, /the input can never be read/);
  });

  await t.test("an operator error fails the attempt with a retry left", async () => {
    const claim = await claimedRun({ fail: "boom" });
    const answer = await handler(claim, context);
    assert.equal(answer.task_status, "Failed");
    assert.match((await task(claim.task.task_id)).last_error, /Error: boom/);
  });
});
