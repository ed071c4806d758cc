// Test-only: the Runtime API loop of Lambda's Node.js runtimes, for `LocalLambda` (the real
// Node runtime is not on this machine). Usage: node lambda_node_runtime.mjs MODULE_PATH EXPORT.
// Like Lambda's: it imports the module once, then for each invocation calls
// `handler(event, context)` (context.getRemainingTimeInMillis from Lambda-Runtime-Deadline-Ms)
// and posts what the promise resolves to as the response, or a rejection as the error.
import { pathToFileURL } from "node:url";

const [modulePath, exportName = "handler"] = process.argv.slice(2);
const api = `http://${process.env.AWS_LAMBDA_RUNTIME_API}/2018-06-01/runtime`;
const handler = (await import(pathToFileURL(modulePath).href))[exportName];
if (typeof handler !== "function") {
  await fetch(`${api}/init/error`, { method: "POST", body: JSON.stringify({ errorMessage: `${exportName} is not a function`, errorType: "Runtime.HandlerNotFound" }) });
  process.exit(1);
}
for (;;) {
  const next = await fetch(`${api}/invocation/next`);
  const requestId = next.headers.get("lambda-runtime-aws-request-id");
  const deadline = Number(next.headers.get("lambda-runtime-deadline-ms"));
  const event = await next.json();
  const context = {
    awsRequestId: requestId,
    functionName: process.env.AWS_LAMBDA_FUNCTION_NAME,
    getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
  };
  try {
    const answer = await handler(event, context);
    await fetch(`${api}/invocation/${requestId}/response`, { method: "POST", body: JSON.stringify(answer ?? null) });
  } catch (error) {
    const body = { errorMessage: String(error?.message ?? error), errorType: error?.name ?? "Error" };
    await fetch(`${api}/invocation/${requestId}/error`, { method: "POST", body: JSON.stringify(body) });
  }
}
