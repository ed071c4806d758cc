// `scatter`, the example image's TypeScript operator: one event on output 0 per number of
// `config.numbers` (its cursor is the number), so the next job gets one task per number.
// Run by the worker wrapper as `node /opt/taskplat/operators/scatter/scatter.js` (operators.yaml);
// the build stage of deploy/worker-example/Dockerfile compiles it to that file.
//
// Invariants: the numbers must be distinct positive integers (a repeated cursor would be routed
// once only), else the task fails permanently with a one-line message; emitting the same events
// again on a retry is harmless (an event is stored once per task and position).
import { emitEvent, PermanentFailure, serve, type Task } from "@taskplat/lambda-runtime";

export async function handle(task: Task): Promise<{ emitted: number }> {
  const numbers = task.config["numbers"];
  const valid =
    Array.isArray(numbers) &&
    numbers.every((n) => Number.isSafeInteger(n) && (n as number) > 0) &&
    new Set(numbers).size === numbers.length;
  if (!valid) {
    throw new PermanentFailure('config.numbers must be distinct positive integers, e.g. {"numbers": [2, 3]}');
  }
  for (const cursor of numbers as number[]) {
    await emitEvent({ output_index: 0, cursor });
  }
  return { emitted: numbers.length };
}

process.exitCode = await serve(handle);
