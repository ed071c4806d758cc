// The generated types (src/contract.ts, ../lambda-runtime-rs/src/contract.rs) are what the
// generator produces from the contracts' JSON Schemas today (quicktype-core is a devDependency,
// `npm ci` installs it; that test skips without it only outside CI), and `checkTaskLine`, the
// runtime's check of a task line, states the same TaskLine schema.
import assert from "node:assert/strict";
import { test } from "node:test";

let generator = null;
try {
  generator = await import("../scripts/generate-types.mjs");
} catch (error) {
  if (process.env.CI === "true") throw error;
}

test("the checked-in generated types are the generator's output", { skip: generator === null && "quicktype-core is not installed" }, async () => {
  const stale = await generator.stale();
  assert.deepEqual(stale, [], `stale generated types: ${stale.join(", ")}; run \`make runtime-types\``);
});

test("checkTaskLine states the TaskLine schema: its required fields, and null where the schema allows it", async () => {
  const { checkTaskLine } = await import("../dist/esm/index.js");
  const { readFileSync } = await import("node:fs");
  const schema = JSON.parse(
    readFileSync(new URL("../../common/tests/snapshots/TaskLine.json", import.meta.url), "utf8"),
  );
  const nullable = (prop) => (prop.anyOf ?? []).some((branch) => branch.type === "null");
  const valid = {
    task_id: "t", attempt: 1, lease_token: "l", operator: "op", queue: "q", config: {}, inputs: [],
    job: { dag_name: "d", name: "j" }, timeout_seconds: 60, deadline_at: "2030-01-01T00:00:00Z",
    outputs: [{ output_index: 0, dataset_uuid: "u", dataset_version: "v", location: "x" }],
    steps: {}, trust: "trusted", traceparent: "tp", tracestate: "ts",
  };
  assert.deepEqual(Object.keys(valid).sort(), Object.keys(schema.properties).sort());
  assert.equal(checkTaskLine(valid), null);
  for (const [name, prop] of Object.entries(schema.properties)) {
    const { [name]: _, ...without } = valid;
    const required = schema.required.includes(name) && !nullable(prop);
    assert.equal(checkTaskLine(without) !== null, required, `without ${name}`);
    assert.equal(checkTaskLine({ ...valid, [name]: null }) !== null, required, `${name}: null`);
    const wrong = Array.isArray(valid[name]) ? "x" : [[]];
    assert.notEqual(checkTaskLine({ ...valid, [name]: wrong }), null, `${name}: the wrong type`);
  }
});
