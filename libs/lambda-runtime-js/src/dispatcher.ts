/**
 * The calls a Lambda attempt makes to the dispatcher, with its attempt token (Node's fetch).
 *
 * Invariants: every call names the attempt's `(task_id, attempt, lease_token)` and carries the
 * attempt token as its bearer credential, never the worker token; a 4xx answer (401 bad token,
 * 403 another attempt, 404 no task, 409 stale attempt or lease) throws `Refused`, which is final:
 * the attempt no longer holds the task; a transport error or a 5xx is retried with a doubling
 * delay while the caller's time allows, then throws `Unreachable`.
 */
import type { Json, JsonObject } from "./operator.js";

export const USER_AGENT = "taskplat-lambda-runtime-js/0.1";

/** The dispatcher refused the call for this attempt (stale, lost lease, bad token). */
export class Refused extends Error {
  readonly status: number;
  readonly body: JsonObject;
  readonly reason: string;

  constructor(status: number, body: JsonObject) {
    const reason = String(body.reason ?? body.error ?? status);
    super(`refused (${status}): ${reason}: ${String(body.message ?? "")}`);
    this.name = "Refused";
    this.status = status;
    this.body = body;
    this.reason = reason;
  }
}

/** The dispatcher did not answer in time. */
export class Unreachable extends Error {
  constructor(message: string) {
    super(message);
    this.name = "Unreachable";
  }
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export async function readJson(response: Response): Promise<JsonObject> {
  const text = await response.text();
  if (text.trim() === "") return {};
  try {
    const value = JSON.parse(text) as Json;
    return typeof value === "object" && value !== null && !Array.isArray(value) ? value : {};
  } catch {
    return {};
  }
}

export class AttemptApi {
  private readonly url: string;
  private readonly fence: JsonObject;

  constructor(
    url: string,
    private readonly token: string,
    fence: { task_id: string; attempt: number; lease_token: string },
    private readonly secondsLeft: () => number,
    private readonly requestTimeout = 10,
  ) {
    this.url = url.replace(/\/+$/, "");
    this.fence = { ...fence };
  }

  heartbeat(): Promise<JsonObject> {
    return this.post("/internal/heartbeat", {});
  }

  async events(events: JsonObject[]): Promise<void> {
    await this.post("/internal/events", { events });
  }

  /** Record a step's result; the one that stands (the first recorded). */
  async step(name: string, result: Json): Promise<Json> {
    const answer = await this.post("/internal/steps", { step: name, result });
    return answer.result ?? null;
  }

  complete(status: string, fields: JsonObject): Promise<JsonObject> {
    const sent: JsonObject = {};
    for (const [key, value] of Object.entries(fields)) {
      if (isSent(value)) sent[key] = value;
    }
    return this.post("/internal/task-complete", { status, ...sent });
  }

  private async post(path: string, body: JsonObject): Promise<JsonObject> {
    const data = JSON.stringify({ ...this.fence, ...body });
    let delay = 0.2;
    for (;;) {
      const timeout = Math.max(0.5, Math.min(this.requestTimeout, this.secondsLeft()));
      let problem: string;
      try {
        const response = await fetch(this.url + path, {
          method: "POST",
          body: data,
          headers: {
            Authorization: `Bearer ${this.token}`,
            "Content-Type": "application/json",
            Accept: "application/json",
            "User-Agent": USER_AGENT,
          },
          signal: AbortSignal.timeout(timeout * 1000),
        });
        if (response.ok) return await readJson(response);
        if (response.status < 500) throw new Refused(response.status, await readJson(response));
        await response.body?.cancel();
        problem = `${path} answered ${response.status}`;
      } catch (error) {
        if (error instanceof Refused) throw error;
        problem = `${path}: ${error instanceof Error ? error.message : String(error)}`;
      }
      if (this.secondsLeft() <= delay + 0.5) {
        throw new Unreachable(`cannot reach the dispatcher at ${this.url}: ${problem}`);
      }
      await sleep(delay * 1000); // a retry pause, bounded by the attempt's time left
      delay = Math.min(delay * 2, 5);
    }
  }
}

/** What the completion sends: no null, empty string, empty list or empty object (as the Python
 * runtime); `false` is sent. */
function isSent(value: Json | undefined): value is Json {
  if (value === undefined || value === null || value === "" || value === 0) return false;
  if (Array.isArray(value)) return value.length > 0;
  if (typeof value === "object") return Object.keys(value).length > 0;
  return true;
}
