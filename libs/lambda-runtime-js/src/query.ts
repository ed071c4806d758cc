/**
 * `query(sql, params)`: read the datasets of the task's capability token through the Query
 * Service (`POST {TASKPLAT_QUERY_URL}/query`, the capability token as bearer credential).
 *
 * Invariants: the token is the running attempt's (Lambda: the invocation's `capability_token`),
 * else `TASKPLAT_CAPABILITY_TOKEN` (the wrapper sets it for untrusted tasks); the body is
 * `{sql, params?, max_rows?, format: "json"}`; any answer but 200 throws `QueryError` (an
 * `OperatorFailure`: an uncaught one fails the task with its message), naming the service's
 * `error` and `message`; the running task's `traceparent` (else `TRACEPARENT`) goes with the
 * request, so the query joins the attempt's trace.
 */
import { currentChannel, currentTraceparent, OperatorFailure, type Json, type JsonObject } from "./operator.js";
import { readJson, USER_AGENT } from "./dispatcher.js";

export const QUERY_URL_ENV = "TASKPLAT_QUERY_URL";
export const CAPABILITY_TOKEN_ENV = "TASKPLAT_CAPABILITY_TOKEN";

export interface QueryColumn {
  name: string;
  type: string;
}

export interface QueryResult {
  columns: QueryColumn[];
  rows: Json[][];
  row_count: number;
  truncated: boolean;
  elapsed_ms: number;
}

export interface QueryOptions {
  maxRows?: number;
  /** Seconds to wait for the answer (default 300). */
  timeoutSeconds?: number;
}

/** The Query Service refused or failed the query. */
export class QueryError extends OperatorFailure {
  readonly status: number;
  readonly body: JsonObject;

  constructor(status: number, body: JsonObject, message: string) {
    super(message);
    this.name = "QueryError";
    this.status = status;
    this.body = body;
  }
}

/** Run one read-only SQL statement over the datasets of the task's capability token. */
export async function query(sql: string, params?: Json[] | null, options: QueryOptions = {}): Promise<QueryResult> {
  const url = process.env[QUERY_URL_ENV];
  if (!url) {
    throw new OperatorFailure(`query needs ${QUERY_URL_ENV} (the Query Service's URL)`);
  }
  const token = currentChannel()?.capabilityToken || process.env[CAPABILITY_TOKEN_ENV];
  if (!token) {
    throw new OperatorFailure("query needs the task's capability token (untrusted jobs have one)");
  }
  const body: JsonObject = { sql };
  if (params !== undefined && params !== null) body.params = params;
  if (options.maxRows !== undefined) body.max_rows = options.maxRows;
  body.format = "json";
  const headers: Record<string, string> = {
    Authorization: `Bearer ${token}`,
    "Content-Type": "application/json",
    Accept: "application/json",
    "User-Agent": USER_AGENT,
  };
  const traceparent = currentTraceparent() || process.env.TRACEPARENT;
  if (traceparent) headers.traceparent = traceparent;
  let response: Response;
  try {
    response = await fetch(`${url.replace(/\/+$/, "")}/query`, {
      method: "POST",
      body: JSON.stringify(body),
      headers,
      signal: AbortSignal.timeout((options.timeoutSeconds ?? 300) * 1000),
    });
  } catch (error) {
    throw new QueryError(0, {}, `query failed: ${error instanceof Error ? error.message : String(error)}`);
  }
  const answer = await readJson(response);
  if (response.status !== 200) {
    const what = response.status < 500 ? "refused" : "failed";
    const detail = `${String(answer.error ?? "error")}: ${String(answer.message ?? "")}`;
    throw new QueryError(response.status, answer, `query ${what} (${response.status}): ${detail}`);
  }
  return answer as unknown as QueryResult;
}
