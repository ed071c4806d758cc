//! The operator SDK, once for both runtimes: the worker wrapper's (`crate::serve`: JSON lines on
//! stdin and stdout) and Lambda's (`crate::lambda::run`). The same contract as the Python and
//! TypeScript runtimes (docs/contracts.md, "Operator protocol").
//!
//! Invariants:
//!  * A handler is `Fn(&Task, &Context) -> Result<TaskResult, Error>`. `Task` and `Envelope` are
//!    generated from the contracts' JSON Schema (`crate::contract`), and a task is read by serde.
//!  * Events, step results and records go through the `Context` the handler is given: it is
//!    `Clone + Send + Sync`, so a thread the handler spawns may emit too (until the handler
//!    returns: the envelope is written after it). Under `serve` they become protocol lines;
//!    under Lambda, `/internal/events` and `/internal/steps` calls.
//!  * A handler's `Err` fails the task: `Error::failure` with just its message, a converted
//!    `std::error::Error` with `<Type>: <message>`, `PermanentFailure` for good (`"retryable":
//!    false`: no retry, Dead at once); a panic fails it with the panic's message.
//!  * An event's `output_index` N is resolved to output N's `dataset_uuid` and
//!    `dataset_version`; an index the job does not have, or an event over `EVENT_MAX_BYTES` of
//!    JSON, fails the task before the event is written.
//!  * A result holding NaN or Infinity fails the task (`TaskResult::payload` checks a typed
//!    payload: serde_json would write `null`).
//!  * `step(name, f)` runs `f` only when no earlier attempt recorded a result for `name`.
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::contract::{Event, Output, OutputTarget, ResultEnvelope, Status, TaskLine};
use crate::error::Error;
use crate::finite;
use crate::query::{query_with, QueryResult};

/// The task an operator runs: a wrapper task line, or a Lambda claim's task with its lease token
/// (generated from the contracts' `TaskLine` schema).
pub type Task = TaskLine;

/// The result envelope: `succeeded` with a payload, or `failed` with an error (generated from the
/// contracts' `ResultEnvelope` schema).
pub type Envelope = ResultEnvelope;

/// The largest records line `publish_records` writes (bytes of JSON).
pub const RECORDS_LINE_BYTES: usize = 200_000;

/// The largest event (bytes of JSON once resolved); a larger one fails the task.
pub const EVENT_MAX_BYTES: usize = 16_384;

/// The error of a result (or step result) that holds NaN or Infinity.
pub const NOT_FINITE: &str = "the result is not JSON: NaN or Infinity";

impl TaskLine {
    /// The job's outputs resolved at claim time (empty for a task of no job).
    pub fn outputs(&self) -> &[OutputTarget] {
        self.outputs.as_deref().unwrap_or(&[])
    }

    /// The resolved output `index` of the task's job.
    pub fn output(&self, index: i64) -> Result<&OutputTarget, Error> {
        self.outputs().iter().find(|o| o.output_index == index).ok_or_else(|| {
            let mut known: Vec<i64> = self.outputs().iter().map(|o| o.output_index).collect();
            known.sort_unstable();
            let known: Vec<String> = known.iter().map(i64::to_string).collect();
            Error::failure(format!("the task's job has no output {} (outputs: [{}])", index, known.join(", ")))
        })
    }
}

impl ResultEnvelope {
    /// A failed envelope (`retryable: false` for a permanent failure).
    pub fn failed(error: &Error) -> Envelope {
        let message = if error.message().is_empty() { "operator failed" } else { error.message() };
        Envelope {
            status: Status::Failed,
            error: Some(message.to_string()),
            retryable: if error.is_permanent() { Some(false) } else { None },
            events: None,
            outputs: None,
            payload: None,
        }
    }

    pub fn succeeded(&self) -> bool {
        self.status == Status::Succeeded
    }
}

/// A handler's result: the payload (an object, or null), and optionally outputs and final events.
#[derive(Clone, Debug, Default)]
pub struct TaskResult {
    pub payload: Value,
    pub outputs: Vec<Output>,
    pub events: Vec<Value>,
}

impl From<Value> for TaskResult {
    fn from(payload: Value) -> TaskResult {
        TaskResult { payload, ..TaskResult::default() }
    }
}

impl TaskResult {
    /// A result whose payload is any `Serialize` value (a struct, a map): one holding NaN or
    /// Infinity fails the task, where `serde_json::to_value` would have made it `null`.
    pub fn payload<T: Serialize + ?Sized>(payload: &T) -> Result<TaskResult, Error> {
        finite::check(payload).map_err(|_| Error::failure(NOT_FINITE))?;
        Ok(serde_json::to_value(payload)?.into())
    }
}

/// Where a running operator's events, steps and records go (the wrapper or the dispatcher).
pub trait Channel: Send + Sync {
    fn events(&self, events: Vec<Value>) -> Result<(), Error>;
    /// Record `result` for step `name`; the result that stands (the first recorded).
    fn step(&self, name: &str, result: Value) -> Result<Value, Error>;
    fn records(&self, _dataset_uuid: &str, _records: &[String]) -> Result<(), Error> {
        Err(Error::failure("publish_records works only under the worker wrapper"))
    }
    /// The capability token for `query` (Lambda: the invocation's), if the channel has one.
    fn capability_token(&self) -> Option<String> {
        None
    }
}

struct Running {
    task: Task,
    channel: Arc<dyn Channel>,
    /// Step results: recorded by earlier attempts, then this attempt's.
    steps: Mutex<Map<String, Value>>,
}

/// What a handler emits, records and publishes through; cheap to clone, and usable from any
/// thread the handler spawns.
#[derive(Clone)]
pub struct Context {
    running: Arc<Running>,
}

impl Context {
    /// The context of `task` with `channel` taking its events and steps (the runtimes make one
    /// per task; a test may too).
    pub fn new(task: Task, channel: Arc<dyn Channel>) -> Context {
        let steps = Mutex::new(task.steps.clone().unwrap_or_default());
        Context { running: Arc::new(Running { task, channel, steps }) }
    }

    /// The task being run.
    pub fn task(&self) -> &Task {
        &self.running.task
    }

    /// Emit one upstream event: `dataset_uuid` and `dataset_version` (or `output_index`, an
    /// output of the task's job), and a `cursor` or a partition (`partition_key`, `start`, `end`).
    pub fn emit_event(&self, event: Value) -> Result<(), Error> {
        self.emit_events(vec![event])
    }

    /// Emit several events in one line (or one request).
    pub fn emit_events(&self, events: Vec<Value>) -> Result<(), Error> {
        let batch = events
            .into_iter()
            .map(|event| resolve_event(event, self.task()))
            .collect::<Result<Vec<Value>, Error>>()?;
        if batch.is_empty() {
            return Ok(());
        }
        self.running.channel.events(batch)
    }

    /// The result of the task's step `name`: recorded by an earlier attempt, else `f()`
    /// (recorded for later attempts).
    pub fn step<F>(&self, name: &str, f: F) -> Result<Value, Error>
    where
        F: FnOnce() -> Result<Value, Error>,
    {
        if let Some(stored) = self.steps().get(name) {
            return Ok(stored.clone());
        }
        let standing = self.running.channel.step(name, f()?)?;
        self.steps().insert(name.to_string(), standing.clone());
        Ok(standing)
    }

    fn steps(&self) -> std::sync::MutexGuard<'_, Map<String, Value>> {
        self.running.steps.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publish records to a buffered_postgres output of the task's job (its index, dataset name
    /// or dataset uuid); returns how many. Each record has `org_id` and `dedupe_key`.
    pub fn publish_records(&self, output: Value, records: &[Value]) -> Result<usize, Error> {
        let dataset_uuid = buffered_output(self.task(), &output)?;
        let channel = &self.running.channel;
        let mut chunk: Vec<String> = Vec::new();
        let mut size = 0;
        for record in records {
            let text = record.to_string();
            if !chunk.is_empty() && size + text.len() + 1 > RECORDS_LINE_BYTES {
                channel.records(&dataset_uuid, &chunk)?;
                chunk.clear();
                size = 0;
            }
            size += text.len() + 1;
            chunk.push(text);
        }
        if !chunk.is_empty() {
            channel.records(&dataset_uuid, &chunk)?;
        }
        Ok(records.len())
    }

    /// Run one read-only SQL statement over the datasets of the task's capability token, through
    /// the Query Service (`crate::query`).
    pub fn query(&self, sql: &str, params: Option<Vec<Value>>, max_rows: Option<u64>) -> Result<QueryResult, Error> {
        query_with(
            self.running.channel.capability_token(),
            self.running.task.traceparent.clone(),
            sql,
            params,
            max_rows,
        )
    }
}

/// The event as the dispatcher takes it: `output_index` becomes that output's `dataset_uuid` and
/// `dataset_version` (a given `dataset_version` is kept); one over `EVENT_MAX_BYTES` fails.
pub fn resolve_event(event: Value, task: &Task) -> Result<Value, Error> {
    let mut fields = match event {
        Value::Object(fields) => fields,
        _ => return Err(Error::failure("an event is a JSON object")),
    };
    let resolved = match fields.remove("output_index") {
        None | Some(Value::Null) => Value::Object(fields),
        Some(index) => {
            let index = index.as_i64().ok_or_else(|| Error::failure("output_index is an integer"))?;
            let output = task.output(index)?;
            let mut resolved = Map::new();
            resolved.insert("dataset_uuid".into(), Value::String(output.dataset_uuid.clone()));
            resolved.insert("dataset_version".into(), Value::String(output.dataset_version.clone()));
            resolved.extend(fields);
            Value::Object(resolved)
        }
    };
    if resolved.to_string().len() > EVENT_MAX_BYTES {
        return Err(Error::failure(format!("an event is larger than {} bytes of JSON", EVENT_MAX_BYTES)));
    }
    Ok(resolved)
}

/// An output of the task's job by index (`json!(0)`), dataset name or dataset uuid.
fn buffered_output(task: &Task, output: &Value) -> Result<String, Error> {
    let found = match output {
        Value::Number(n) => task.output(n.as_i64().unwrap_or(-1))?,
        Value::String(s) => task
            .outputs()
            .iter()
            .find(|o| o.dataset.as_deref() == Some(s) || &o.dataset_uuid == s)
            .ok_or_else(|| Error::failure(format!("the task's job has no output dataset {}", output)))?,
        _ => return Err(Error::failure("an output is its index, dataset name or dataset uuid")),
    };
    if found.kind.as_deref() != Some("buffered_postgres") {
        return Err(Error::failure(format!("output {} is not a buffered_postgres dataset", output)));
    }
    Ok(found.dataset_uuid.clone())
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        format!("panic: {}", text)
    } else if let Some(text) = panic.downcast_ref::<String>() {
        format!("panic: {}", text)
    } else {
        "panic".to_string()
    }
}

/// Run `handler` on `task` with `channel` taking its events and steps; the result envelope
/// (`succeeded` with the payload, or `failed` with the error), never a panic.
pub fn run_operator<H>(handler: &H, task: Task, channel: Arc<dyn Channel>) -> Envelope
where
    H: Fn(&Task, &Context) -> Result<TaskResult, Error> + ?Sized,
{
    let context = Context::new(task, channel);
    let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(context.task(), &context)));
    let result = match answer {
        Ok(Ok(result)) => result,
        Ok(Err(error)) => {
            if error.is_other() {
                eprintln!("{}", error.message());
            }
            return Envelope::failed(&error);
        }
        Err(panic) => return Envelope::failed(&Error::failure(panic_message(&*panic))),
    };
    let payload = match result.payload {
        Value::Null => None,
        Value::Object(fields) => Some(fields),
        other => return Envelope::failed(&Error::failure(format!("the handler returned {}, not an object", other))),
    };
    let mut events = Vec::new();
    for event in result.events {
        let resolved = match resolve_event(event, context.task()) {
            Ok(resolved) => resolved,
            Err(error) => return Envelope::failed(&error),
        };
        match serde_json::from_value::<Event>(resolved) {
            Ok(event) => events.push(event),
            Err(error) => return Envelope::failed(&Error::failure(format!("an event is not valid: {}", error))),
        }
    }
    Envelope {
        status: Status::Succeeded,
        payload,
        outputs: if result.outputs.is_empty() { None } else { Some(result.outputs) },
        events: if events.is_empty() { None } else { Some(events) },
        error: None,
        retryable: None,
    }
}
