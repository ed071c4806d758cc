// Builds dist/esm (ES modules) and dist/cjs (CommonJS), each with its .d.ts files, from src/.
// dist/cjs gets a package.json saying "commonjs", so Node loads those .js files as CommonJS
// although the package itself is "type": "module".
import { execFileSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
rmSync(join(root, "dist"), { recursive: true, force: true });
for (const config of ["tsconfig.esm.json", "tsconfig.cjs.json"]) {
  execFileSync(process.execPath, [tsc, "-p", join(root, config)], { stdio: "inherit" });
}
mkdirSync(join(root, "dist", "cjs"), { recursive: true });
writeFileSync(join(root, "dist", "cjs", "package.json"), '{"type": "commonjs"}\n');
