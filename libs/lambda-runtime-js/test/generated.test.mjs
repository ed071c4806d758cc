// The generated types (src/contract.ts, ../lambda-runtime-rs/src/contract.rs) are what the
// generator produces from the contracts' JSON Schemas today. quicktype-core is a devDependency
// (`npm ci` installs it); the test skips without it only outside CI.
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
