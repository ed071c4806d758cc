//! `taskplat::lambda::run(handle)`: a Rust operator as an AWS Lambda function on the `provided`
//! runtimes (`provided.al2023`): the Runtime API loop (`GET /2018-06-01/runtime/invocation/next`,
//! then `POST .../invocation/{id}/response`, or `.../error` for an event that is no claim).
//!
//! The event is the claim made on the function's behalf (`task`, `attempt`, `lease_token`,
//! `lease_expires_at`, `attempt_token`, and `capability_token` for untrusted jobs). The
//! dispatcher's URL is the function's `TASKPLAT_DISPATCHER_URL`; the function holds no worker
//! token and no database credentials, only the attempt token of its invocation.
//!
//! Invariants (the same as the Python and TypeScript runtimes):
//!  * the first call is a heartbeat, and nothing runs before it answered: a canceled, stale,
//!    duplicate or expired attempt is refused there and runs no operator code (the response is
//!    `{"status": "Refused", "reason", "task_id", "attempt"}`);
//!  * while the operator runs, a heartbeat every third of the lease keeps the attempt; a refused
//!    heartbeat means the attempt was taken away: its events are refused at once;
//!  * events go to `/internal/events` as they are emitted, step results to `/internal/steps`;
//!  * the completion is sent once: `Completed` with the result, or `Failed` with the error
//!    (`retryable: false` for a permanent failure), or `Failed` "timed out" when the operator has
//!    not finished `TASKPLAT_LAMBDA_MARGIN_SECONDS` (default 2) before the earlier of the
//!    function's limit and the attempt's deadline; the process then exits after reporting, so no
//!    abandoned operator thread runs on into a later invocation;
//!  * an operator's failure is never a Runtime API error: the response says what happened.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::dispatcher::{agent, now_seconds, parse_rfc3339, AttemptApi, CallError};
use crate::error::Error;
use crate::operator::{run_operator, Channel, Context, Envelope, Task, TaskResult};

pub const URL_ENV: &str = "TASKPLAT_DISPATCHER_URL";
pub const MARGIN_ENV: &str = "TASKPLAT_LAMBDA_MARGIN_SECONDS";
pub const DEFAULT_MARGIN_SECONDS: f64 = 2.0;
const MAX_HEARTBEAT_INTERVAL: f64 = 20.0;

fn log(event: &str, mut fields: Map<String, Value>) {
    fields.insert("event".into(), json!(event));
    eprintln!("{}", Value::Object(fields));
}

/// A third of the lease the dispatcher just granted (bounded).
fn interval(answer: &Value) -> f64 {
    match answer.get("lease_expires_at").and_then(Value::as_str).and_then(parse_rfc3339) {
        Some(at) => ((at - now_seconds()) / 3.0).min(MAX_HEARTBEAT_INTERVAL).max(0.5),
        None => 5.0,
    }
}

struct Attempt {
    api: AttemptApi,
    lease_lost: AtomicBool,
    capability_token: Option<String>,
}

impl Attempt {
    fn refused(&self, what: &str, error: CallError) -> Error {
        match error {
            CallError::Refused { reason, .. } => {
                self.lease_lost.store(true, Ordering::SeqCst);
                Error::failure(format!("{} refused: {}", what, reason))
            }
            CallError::Unreachable(message) => Error::other("Unreachable", message),
        }
    }
}

impl Channel for Attempt {
    fn events(&self, events: Vec<Value>) -> Result<(), Error> {
        if self.lease_lost.load(Ordering::SeqCst) {
            return Err(Error::failure("the attempt lost its lease; its events are refused"));
        }
        self.api.events(events).map(|_| ()).map_err(|e| self.refused("events", e))
    }

    fn step(&self, name: &str, result: Value) -> Result<Value, Error> {
        if self.lease_lost.load(Ordering::SeqCst) {
            return Err(Error::failure("the attempt lost its lease; its steps are refused"));
        }
        self.api.step(name, result).map_err(|e| self.refused("step", e))
    }

    fn capability_token(&self) -> Option<String> {
        self.capability_token.clone()
    }
}

/// What one invocation answers, and whether the sandbox must exit after answering (an operator
/// thread was abandoned).
pub struct Answer {
    pub response: Value,
    pub exit_after: bool,
}

/// Run one invocation: `event` is the claim, `deadline` the function's limit (Unix seconds).
pub fn invoke<H>(handler: Arc<H>, event: Value, deadline: f64, url: &str, margin: f64) -> Result<Answer, String>
where
    H: Fn(&Task, &Context) -> Result<TaskResult, Error> + Send + Sync + 'static,
{
    let claimed = event.get("task").filter(|t| t.is_object()).ok_or("the event is not a Taskplat claim: it has no task")?;
    let (attempt_token, lease_token) = match (
        event.get("attempt_token").and_then(Value::as_str),
        event.get("lease_token").and_then(Value::as_str),
    ) {
        (Some(a), Some(l)) => (a.to_string(), l.to_string()),
        _ => return Err("the event is not a Taskplat claim: no attempt_token or lease_token".into()),
    };
    let mut document = claimed.clone();
    document["lease_token"] = json!(lease_token);
    let task: Task = serde_json::from_value(document).map_err(|e| format!("the event's task is not a task: {}", e))?;
    let attempt_deadline = task.deadline_at.as_deref().and_then(parse_rfc3339);
    let seconds_left = move || {
        let limit = attempt_deadline.map_or(deadline, |d| d.min(deadline));
        limit - now_seconds()
    };
    let attempt = Arc::new(Attempt {
        api: AttemptApi::new(url, &attempt_token, &task.task_id, task.attempt, &lease_token, Box::new(seconds_left)),
        lease_lost: AtomicBool::new(false),
        capability_token: event.get("capability_token").and_then(Value::as_str).map(str::to_string),
    });
    let mut fence = Map::new();
    fence.insert("task_id".into(), json!(task.task_id));
    fence.insert("attempt".into(), json!(task.attempt));
    let first = match attempt.api.heartbeat() {
        Ok(first) => first,
        Err(CallError::Refused { reason, .. }) => {
            let mut logged = fence.clone();
            logged.insert("reason".into(), json!(reason));
            log("taskplat_invocation_refused", logged);
            let mut response = Map::new();
            response.insert("status".into(), json!("Refused"));
            response.insert("reason".into(), json!(reason));
            response.extend(fence);
            return Ok(Answer { response: Value::Object(response), exit_after: false });
        }
        Err(CallError::Unreachable(message)) => {
            let mut logged = fence.clone();
            logged.insert("error".into(), json!(message));
            log("taskplat_dispatcher_unreachable", logged);
            let mut response = Map::new();
            response.insert("status".into(), json!("Unreachable"));
            response.extend(fence);
            return Ok(Answer { response: Value::Object(response), exit_after: false });
        }
    };
    let (stop, stopped) = mpsc::channel::<()>();
    let beating = {
        let attempt = attempt.clone();
        let task_id = task.task_id.clone();
        let mut every = interval(&first);
        std::thread::spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::from_secs_f64(every)) {
                match attempt.api.heartbeat() {
                    Ok(answer) => every = interval(&answer),
                    Err(CallError::Refused { reason, .. }) => {
                        attempt.lease_lost.store(true, Ordering::SeqCst);
                        log("taskplat_lease_lost", json!({"task_id": task_id, "reason": reason}).as_object().cloned().unwrap_or_default());
                        return;
                    }
                    Err(CallError::Unreachable(message)) => {
                        log("taskplat_heartbeat_failed", json!({"task_id": task_id, "error": message}).as_object().cloned().unwrap_or_default());
                    }
                }
            }
        })
    };
    let (done, outcome) = mpsc::channel::<Envelope>();
    {
        let attempt: Arc<dyn Channel> = attempt.clone();
        let handler = handler.clone();
        let task = task.clone();
        std::thread::spawn(move || {
            let envelope = run_operator(&*handler, task, attempt);
            done.send(envelope).ok();
        });
    }
    let wait = (attempt.api.seconds_left() - margin).max(0.0);
    let (outcome, timed_out) = match outcome.recv_timeout(Duration::from_secs_f64(wait)) {
        Ok(envelope) => (envelope, false),
        Err(_) => {
            let left = attempt.api.seconds_left().max(0.0);
            let error = format!("timed out: the operator was still running {:.1}s before the function's time limit", left);
            (Envelope::failed(&Error::failure(error)), true)
        }
    };
    drop(stop);
    let answer = match complete(&attempt.api, &outcome) {
        Ok(answer) => answer,
        Err(CallError::Refused { reason, .. }) => {
            let mut logged = fence.clone();
            logged.insert("reason".into(), json!(reason));
            log("taskplat_completion_refused", logged);
            json!({"status": "Refused", "reason": reason})
        }
        Err(CallError::Unreachable(message)) => {
            let mut logged = fence.clone();
            logged.insert("error".into(), json!(message));
            log("taskplat_dispatcher_unreachable", logged);
            json!({"status": "Unreachable"})
        }
    };
    beating.join().ok();
    let succeeded = outcome.succeeded();
    let mut response = Map::new();
    response.insert("status".into(), answer.get("status").cloned().unwrap_or(Value::Null));
    response.insert("outcome".into(), json!(if succeeded { "Completed" } else { "Failed" }));
    response.extend(fence);
    if let Some(status) = answer.get("task_status") {
        response.insert("task_status".into(), status.clone());
    }
    log("taskplat_attempt_reported", response.clone());
    Ok(Answer { response: Value::Object(response), exit_after: timed_out })
}

fn complete(api: &AttemptApi, outcome: &Envelope) -> Result<Value, CallError> {
    let mut fields = Map::new();
    if outcome.succeeded() {
        fields.insert("result".into(), json!(outcome.payload));
        fields.insert("outputs".into(), json!(outcome.outputs));
        fields.insert("events".into(), json!(outcome.events));
        return api.complete("Completed", fields);
    }
    let error: String = outcome.error.as_deref().unwrap_or("operator failed").chars().take(16_000).collect();
    fields.insert("error_message".into(), json!(error));
    if outcome.retryable == Some(false) {
        fields.insert("retryable".into(), json!(false));
    }
    api.complete("Failed", fields)
}

/// The Lambda Runtime API loop of a `provided` runtime's `bootstrap`: runs `handler` for each
/// invocation, forever (Lambda ends the process).
pub fn run<H>(handler: H) -> !
where
    H: Fn(&Task, &Context) -> Result<TaskResult, Error> + Send + Sync + 'static,
{
    let handler = Arc::new(handler);
    let api = match std::env::var("AWS_LAMBDA_RUNTIME_API") {
        Ok(host) => format!("http://{}/2018-06-01/runtime", host),
        Err(_) => {
            eprintln!("AWS_LAMBDA_RUNTIME_API is not set: this bootstrap runs under Lambda only");
            std::process::exit(2);
        }
    };
    let client = agent();
    let url = std::env::var(URL_ENV).unwrap_or_default();
    let margin = std::env::var(MARGIN_ENV).ok().and_then(|m| m.parse::<f64>().ok()).unwrap_or(DEFAULT_MARGIN_SECONDS);
    if url.is_empty() {
        let error = json!({"errorMessage": format!("{} is not set: the function cannot reach the dispatcher", URL_ENV), "errorType": "Runtime.ConfigurationError"});
        client.post(&format!("{}/init/error", api)).send_string(&error.to_string()).ok();
        std::process::exit(1);
    }
    loop {
        let next = match client.get(&format!("{}/invocation/next", api)).call() {
            Ok(next) => next,
            Err(error) => {
                eprintln!("the Runtime API did not answer invocation/next: {}", error);
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let request_id = next.header("Lambda-Runtime-Aws-Request-Id").unwrap_or_default().to_string();
        let deadline = next
            .header("Lambda-Runtime-Deadline-Ms")
            .and_then(|ms| ms.parse::<f64>().ok())
            .map_or(now_seconds() + 900.0, |ms| ms / 1000.0);
        let event: Value = next.into_string().ok().and_then(|text| serde_json::from_str(&text).ok()).unwrap_or(Value::Null);
        let (path, body, exit_after) = match invoke(handler.clone(), event, deadline, &url, margin) {
            Ok(answer) => ("response", answer.response, answer.exit_after),
            Err(message) => ("error", json!({"errorMessage": message, "errorType": "Taskplat.InvalidEvent"}), false),
        };
        if let Err(error) = client.post(&format!("{}/invocation/{}/{}", api, request_id, path)).send_string(&body.to_string()) {
            eprintln!("the Runtime API refused the {}: {}", path, error);
        }
        if exit_after {
            std::process::exit(0);
        }
    }
}
