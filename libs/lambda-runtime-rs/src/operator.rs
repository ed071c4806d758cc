//! The operator SDK, once for both runtimes: the worker wrapper's (`serve`: JSON lines on stdin
//! and stdout) and Lambda's (`crate::lambda::run`). The same contract as the Python and
//! TypeScript runtimes.
//!
//! Invariants:
//!  * `serve` answers every task line on stdin with exactly one envelope line on stdout; while it
//!    runs, file descriptor 1 points at stderr, so a stray `println!` cannot corrupt the
//!    protocol: only the SDK writes protocol lines (on a duplicate of the original stdout).
//!  * Events, step results and records go to the running operator's `Channel` (a thread-local
//!    set for the duration of the handler): protocol lines under `serve`, `/internal/events` and
//!    `/internal/steps` calls under Lambda.
//!  * A handler's `Err` fails the task: `Error::failure` with just its message, a converted
//!    `std::error::Error` with `<Type>: <message>`, `PermanentFailure` for good (`"retryable":
//!    false`: no retry, Dead at once); a panic fails it with the panic's message.
//!  * `emit_event` with `output_index` N fills `dataset_uuid` and `dataset_version` from the
//!    task's resolved output N; an index the job does not have fails the task.
//!  * `step(name, f)` runs `f` only when no earlier attempt recorded a result for `name`.
use std::cell::RefCell;
use std::fmt;
use std::io::{BufRead, Write};
use std::sync::Arc;

use serde_json::{json, Map, Value};

/// The largest records line `publish_records` writes (bytes of JSON).
pub const RECORDS_LINE_BYTES: usize = 200_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The message is the error (an `OperatorFailure`).
    Failure,
    /// Fail the task for good.
    Permanent,
    /// Any other error: `<Type>: <message>`.
    Other,
}

/// Why a handler failed. `?` converts any `std::error::Error` into one.
pub struct Error {
    kind: Kind,
    message: String,
}

impl Error {
    /// Fail the task with this message (an `OperatorFailure`).
    pub fn failure(message: impl Into<String>) -> Error {
        Error { kind: Kind::Failure, message: message.into() }
    }

    /// Fail the task for good: no retry, the task is Dead at once.
    pub fn permanent(message: impl Into<String>) -> Error {
        Error { kind: Kind::Permanent, message: message.into() }
    }

    /// Any other error, as `<kind>: <message>` (the other runtimes' exception name and message).
    pub(crate) fn other(kind: &str, message: impl fmt::Display) -> Error {
        Error { kind: Kind::Other, message: format!("{}: {}", kind, message) }
    }

    pub fn is_permanent(&self) -> bool {
        self.kind == Kind::Permanent
    }

    /// The error of the failed task.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({:?}, {:?})", self.kind, self.message)
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(error: E) -> Error {
        let name = std::any::type_name::<E>();
        let short = name.split('<').next().unwrap_or(name).rsplit("::").next().unwrap_or(name);
        Error { kind: Kind::Other, message: format!("{}: {}", short, error) }
    }
}

/// Return `Err(PermanentFailure(..).into())` to fail the task for good.
#[derive(Debug, Clone)]
pub struct PermanentFailure(pub String);

impl From<PermanentFailure> for Error {
    fn from(failure: PermanentFailure) -> Error {
        Error::permanent(failure.0)
    }
}

/// The task an operator runs: a wrapper task line, or a Lambda claim's task.
#[derive(Clone, Debug)]
pub struct Task {
    pub task_id: String,
    pub attempt: i64,
    pub lease_token: String,
    pub deadline_at: Option<String>,
    pub operator: String,
    pub queue: String,
    pub config: Map<String, Value>,
    pub inputs: Vec<Value>,
    pub job: Option<Value>,
    pub timeout_seconds: Option<i64>,
    /// The job's outputs resolved at claim time: `{output_index, dataset_uuid, dataset_version, ..}`.
    pub outputs: Vec<Map<String, Value>>,
    /// Step results earlier attempts recorded.
    pub steps: Map<String, Value>,
    /// The task document as received.
    pub document: Value,
}

fn text(doc: &Value, key: &str) -> String {
    match doc.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn object(value: Option<&Value>) -> Map<String, Value> {
    value.and_then(Value::as_object).cloned().unwrap_or_default()
}

impl Task {
    pub fn from_document(doc: Value) -> Result<Task, Error> {
        let task_id = doc.get("task_id").and_then(Value::as_str);
        let attempt = doc.get("attempt").and_then(Value::as_i64);
        let (task_id, attempt) = match (task_id, attempt) {
            (Some(t), Some(a)) => (t.to_string(), a),
            _ => return Err(Error::failure("a task needs task_id and attempt")),
        };
        let outputs = doc
            .get("outputs")
            .and_then(Value::as_array)
            .map(|all| all.iter().filter_map(|o| o.as_object().cloned()).collect())
            .unwrap_or_default();
        Ok(Task {
            task_id,
            attempt,
            lease_token: text(&doc, "lease_token"),
            deadline_at: doc.get("deadline_at").and_then(Value::as_str).map(str::to_string),
            operator: text(&doc, "operator"),
            queue: text(&doc, "queue"),
            config: object(doc.get("config")),
            inputs: doc.get("inputs").and_then(Value::as_array).cloned().unwrap_or_default(),
            job: doc.get("job").filter(|j| j.is_object()).cloned(),
            timeout_seconds: doc.get("timeout_seconds").and_then(Value::as_i64),
            outputs,
            steps: object(doc.get("steps")),
            document: doc,
        })
    }

    /// The resolved output `index` of the task's job.
    pub fn output(&self, index: i64) -> Result<&Map<String, Value>, Error> {
        self.outputs
            .iter()
            .find(|o| o.get("output_index").and_then(Value::as_i64) == Some(index))
            .ok_or_else(|| {
                let mut known: Vec<i64> = self
                    .outputs
                    .iter()
                    .filter_map(|o| o.get("output_index").and_then(Value::as_i64))
                    .collect();
                known.sort_unstable();
                let known: Vec<String> = known.iter().map(i64::to_string).collect();
                Error::failure(format!(
                    "the task's job has no output {} (outputs: [{}])",
                    index,
                    known.join(", ")
                ))
            })
    }
}

/// A handler's result: the payload (an object, or null), and optionally outputs and final events.
#[derive(Clone, Debug, Default)]
pub struct TaskResult {
    pub payload: Value,
    pub outputs: Vec<Value>,
    pub events: Vec<Value>,
}

impl From<Value> for TaskResult {
    fn from(payload: Value) -> TaskResult {
        TaskResult { payload, ..TaskResult::default() }
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
}

thread_local! {
    static RUNNING: RefCell<Option<Running>> = RefCell::new(None);
}

fn with_running<T>(what: &str, f: impl FnOnce(&mut Running) -> Result<T, Error>) -> Result<T, Error> {
    RUNNING.with(|cell| match cell.borrow_mut().as_mut() {
        Some(running) => f(running),
        None => Err(Error::failure(format!(
            "{} works only inside a handler run by serve or Lambda",
            what
        ))),
    })
}

/// The running operator's channel, if any (for `query`).
pub(crate) fn current_channel() -> Option<Arc<dyn Channel>> {
    RUNNING.with(|cell| cell.borrow().as_ref().map(|r| r.channel.clone()))
}

/// The event as the dispatcher takes it: `output_index` becomes that output's `dataset_uuid` and
/// `dataset_version` (a given `dataset_version` is kept).
pub fn resolve_event(event: Value, task: &Task) -> Result<Value, Error> {
    let mut fields = match event {
        Value::Object(fields) => fields,
        _ => return Err(Error::failure("an event is a JSON object")),
    };
    let index = match fields.remove("output_index") {
        None | Some(Value::Null) => return Ok(Value::Object(fields)),
        Some(index) => index
            .as_i64()
            .ok_or_else(|| Error::failure("output_index is an integer"))?,
    };
    let output = task.output(index)?;
    let mut resolved = Map::new();
    for key in ["dataset_uuid", "dataset_version"] {
        resolved.insert(key.to_string(), output.get(key).cloned().unwrap_or(Value::Null));
    }
    resolved.extend(fields);
    Ok(Value::Object(resolved))
}

/// Emit one upstream event: `dataset_uuid` and `dataset_version` (or `output_index`, an output of
/// the task's job), and a `cursor` or a partition (`partition_key`, `start`, `end`).
pub fn emit_event(event: Value) -> Result<(), Error> {
    emit_events(vec![event])
}

/// Emit several events in one line (or one request).
pub fn emit_events(events: Vec<Value>) -> Result<(), Error> {
    let (task, channel) = with_running("emitting events", |r| Ok((r.task.clone(), r.channel.clone())))?;
    let batch = events
        .into_iter()
        .map(|event| resolve_event(event, &task))
        .collect::<Result<Vec<Value>, Error>>()?;
    if batch.is_empty() {
        return Ok(());
    }
    channel.events(batch)
}

/// The result of the task's step `name`: recorded by an earlier attempt, else `f()` (recorded
/// for later attempts).
pub fn step<F>(name: &str, f: F) -> Result<Value, Error>
where
    F: FnOnce() -> Result<Value, Error>,
{
    let (stored, channel) = with_running("step", |r| Ok((r.task.steps.get(name).cloned(), r.channel.clone())))?;
    if let Some(stored) = stored {
        return Ok(stored);
    }
    let standing = channel.step(name, f()?)?;
    with_running("step", |r| {
        r.task.steps.insert(name.to_string(), standing.clone());
        Ok(())
    })?;
    Ok(standing)
}

/// An output of the task's job by index (`json!(0)`), dataset name or dataset uuid.
fn buffered_output(task: &Task, output: &Value) -> Result<String, Error> {
    let found = match output {
        Value::Number(n) => task.output(n.as_i64().unwrap_or(-1))?,
        Value::String(s) => task
            .outputs
            .iter()
            .find(|o| o.get("dataset").and_then(Value::as_str) == Some(s) || o.get("dataset_uuid").and_then(Value::as_str) == Some(s))
            .ok_or_else(|| Error::failure(format!("the task's job has no output dataset {}", output)))?,
        _ => return Err(Error::failure("an output is its index, dataset name or dataset uuid")),
    };
    if found.get("kind").and_then(Value::as_str) != Some("buffered_postgres") {
        return Err(Error::failure(format!("output {} is not a buffered_postgres dataset", output)));
    }
    Ok(found.get("dataset_uuid").and_then(Value::as_str).unwrap_or_default().to_string())
}

/// Publish records to a buffered_postgres output of the task's job (its index, dataset name or
/// dataset uuid); returns how many. Each record has `org_id` and `dedupe_key`.
pub fn publish_records(output: Value, records: &[Value]) -> Result<usize, Error> {
    let (task, channel) = with_running("publish_records", |r| Ok((r.task.clone(), r.channel.clone())))?;
    let dataset_uuid = buffered_output(&task, &output)?;
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

fn failed(error: &Error) -> Value {
    let message = if error.message.is_empty() { "operator failed" } else { &error.message };
    if error.is_permanent() {
        json!({"status": "failed", "retryable": false, "error": message})
    } else {
        json!({"status": "failed", "error": message})
    }
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
/// (`{"status": "succeeded", "payload", ..}` or `{"status": "failed", "error", ..}`).
pub fn run_operator<H>(handler: &H, task: Task, channel: Arc<dyn Channel>) -> Value
where
    H: Fn(&Task) -> Result<TaskResult, Error> + ?Sized,
{
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            RUNNING.with(|cell| cell.borrow_mut().take());
        }
    }
    let view = task.clone();
    RUNNING.with(|cell| *cell.borrow_mut() = Some(Running { task: task.clone(), channel }));
    let _reset = Reset;
    let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&view)));
    let result = match answer {
        Ok(Ok(result)) => result,
        Ok(Err(error)) => {
            if error.kind == Kind::Other {
                eprintln!("{}", error.message);
            }
            return failed(&error);
        }
        Err(panic) => return failed(&Error::failure(panic_message(&*panic))),
    };
    let payload = match result.payload {
        Value::Null => Value::Null,
        Value::Object(fields) => Value::Object(fields),
        other => return failed(&Error::failure(format!("the handler returned {}, not an object", other))),
    };
    let mut envelope = json!({"status": "succeeded", "payload": payload});
    if !result.outputs.is_empty() {
        envelope["outputs"] = Value::Array(result.outputs);
    }
    if !result.events.is_empty() {
        let events: Result<Vec<Value>, Error> =
            result.events.into_iter().map(|event| resolve_event(event, &task)).collect();
        match events {
            Ok(events) => envelope["events"] = Value::Array(events),
            Err(error) => return failed(&error),
        }
    }
    envelope
}

/// The worker wrapper's channel: one flushed JSON line on the protocol stream per call.
struct Lines {
    out: std::sync::Mutex<Box<dyn Write + Send>>,
}

impl Lines {
    fn write(&self, line: &str) -> Result<(), Error> {
        let mut out = self.out.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
        out.flush()?;
        Ok(())
    }
}

impl Channel for Lines {
    fn events(&self, mut events: Vec<Value>) -> Result<(), Error> {
        let line = if events.len() == 1 { json!({"event": events.remove(0)}) } else { json!({"events": events}) };
        self.write(&line.to_string())
    }

    fn step(&self, name: &str, result: Value) -> Result<Value, Error> {
        self.write(&json!({"step": {"name": name, "result": result.clone()}}).to_string())?;
        Ok(result)
    }

    fn records(&self, dataset_uuid: &str, records: &[String]) -> Result<(), Error> {
        self.write(&format!(
            "{{\"dataset_uuid\":{},\"records\":[{}]}}",
            Value::String(dataset_uuid.to_string()),
            records.join(",")
        ))
    }
}

#[cfg(unix)]
mod fds {
    extern "C" {
        fn dup(fd: i32) -> i32;
        fn dup2(from: i32, to: i32) -> i32;
    }

    /// A duplicate of stdout for the protocol, with fd 1 pointed at stderr (stray prints).
    pub fn protocol_stdout() -> Option<std::fs::File> {
        use std::os::unix::io::FromRawFd;
        // SAFETY: plain descriptor calls on the process's own stdout and stderr; the duplicate
        // is owned by the returned File alone.
        unsafe {
            let protocol = dup(1);
            if protocol < 0 || dup2(2, 1) < 0 {
                return None;
            }
            Some(std::fs::File::from_raw_fd(protocol))
        }
    }
}

/// The worker wrapper's side: answer each task line of stdin with one envelope line; returns 0
/// when stdin closes (the process's exit code).
pub fn serve<H>(handler: H) -> i32
where
    H: Fn(&Task) -> Result<TaskResult, Error>,
{
    std::io::stdout().flush().ok();
    #[cfg(unix)]
    let out: Box<dyn Write + Send> = match fds::protocol_stdout() {
        Some(file) => Box::new(file),
        None => Box::new(std::io::stdout()),
    };
    #[cfg(not(unix))]
    let out: Box<dyn Write + Send> = Box::new(std::io::stdout());
    serve_lines(handler, std::io::stdin().lock(), out)
}

/// `serve` over any line source and protocol sink (the tests').
pub fn serve_lines<H, R>(handler: H, input: R, out: Box<dyn Write + Send>) -> i32
where
    H: Fn(&Task) -> Result<TaskResult, Error>,
    R: BufRead,
{
    let lines = Arc::new(Lines { out: std::sync::Mutex::new(out) });
    for line in input.lines() {
        let line = match line {
            Ok(line) => line,
            Err(error) => {
                eprintln!("cannot read a task line: {}", error);
                return 1;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let envelope = match serde_json::from_str::<Value>(&line).map_err(Error::from).and_then(Task::from_document) {
            Ok(task) => run_operator(&handler, task, lines.clone()),
            Err(error) => failed(&error),
        };
        if let Err(error) = lines.write(&envelope.to_string()) {
            eprintln!("cannot write the result: {}", error);
            return 1;
        }
    }
    0
}
