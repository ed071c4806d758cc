//! The example operator of the Rust runtime, the same as the Python and JavaScript ones (the
//! shared contract tests run all three), built as Lambda's `bootstrap`: it serves the worker
//! wrapper's protocol, or the Lambda Runtime API when AWS_LAMBDA_RUNTIME_API is set.
//!
//! Config: `crash` (exit at once, answering nothing), `print` (a stray line on stdout),
//! `sleep_seconds` (then go on), `events` (emitted as given), `forward` (one event on output 0 per
//! input, at its cursor), `steps` (names: each step's result is the attempt that first ran it),
//! `query` ({sql, params, max_rows}: its answer goes in the payload), `records` ({output,
//! records}: published), `event_bytes` (one event on output 0 whose partition_key is that many
//! bytes), `fail` / `permanent` (fail with this message, permanently for the latter),
//! `non_finite` ("nan" or "inf": a payload holding that number). Payload: {attempt, emitted, inputs (their cursors)} plus `steps`, `query`,
//! `published`.
use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use taskplat::{Context, Error, PermanentFailure, Task, TaskResult};

fn handle(task: &Task, ctx: &Context) -> Result<TaskResult, Error> {
    let config = &task.config;
    if config.get("crash").and_then(Value::as_bool) == Some(true) {
        std::process::exit(3);
    }
    if let Some(text) = config.get("print").and_then(Value::as_str) {
        println!("{}", text);
    }
    if let Some(seconds) = config.get("sleep_seconds").and_then(Value::as_f64) {
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
    }
    let inputs: Vec<Value> = task.inputs.iter().map(|i| i.get("cursor").cloned().unwrap_or(Value::Null)).collect();
    let mut payload = json!({"attempt": task.attempt, "emitted": 0, "inputs": inputs});
    let mut emitted = 0;
    for event in config.get("events").and_then(Value::as_array).cloned().unwrap_or_default() {
        ctx.emit_event(event)?;
        emitted += 1;
    }
    if let Some(size) = config.get("event_bytes").and_then(Value::as_u64) {
        ctx.emit_event(json!({"output_index": 0, "partition_key": "x".repeat(size as usize)}))?;
        emitted += 1;
    }
    if config.get("forward").and_then(Value::as_bool) == Some(true) {
        for item in &task.inputs {
            ctx.emit_event(json!({"output_index": 0, "cursor": item.get("cursor").cloned().unwrap_or(Value::Null)}))?;
            emitted += 1;
        }
    }
    payload["emitted"] = json!(emitted);
    if let Some(names) = config.get("steps").and_then(Value::as_array) {
        let mut steps = Map::new();
        for name in names.iter().filter_map(Value::as_str) {
            steps.insert(name.to_string(), ctx.step(name, || Ok(json!(task.attempt)))?);
        }
        payload["steps"] = Value::Object(steps);
    }
    if let Some(asked) = config.get("query") {
        let sql = asked.get("sql").and_then(Value::as_str).unwrap_or_default();
        let params = asked.get("params").and_then(Value::as_array).cloned();
        let answer = ctx.query(sql, params, asked.get("max_rows").and_then(Value::as_u64))?;
        let columns: Vec<Value> = answer.columns.iter().map(|c| json!({"name": c.name, "type": c.type_name})).collect();
        payload["query"] = json!({
            "columns": columns, "rows": answer.rows, "row_count": answer.row_count,
            "truncated": answer.truncated, "elapsed_ms": answer.elapsed_ms,
        });
    }
    if let Some(records) = config.get("records") {
        let rows = records.get("records").and_then(Value::as_array).cloned().unwrap_or_default();
        payload["published"] = json!(ctx.publish_records(records.get("output").cloned().unwrap_or(json!(0)), &rows)?);
    }
    if let Some(message) = config.get("fail").and_then(Value::as_str) {
        return Err(std::io::Error::new(std::io::ErrorKind::Other, message.to_string()).into());
    }
    if let Some(message) = config.get("permanent").and_then(Value::as_str) {
        return Err(PermanentFailure(message.to_string()).into());
    }
    if let Some(which) = config.get("non_finite").and_then(Value::as_str) {
        // A typed payload: serde_json would write the number as null, the runtime refuses it.
        let mut typed = BTreeMap::new();
        typed.insert("ratio", if which == "nan" { f64::NAN } else { f64::INFINITY });
        return TaskResult::payload(&typed);
    }
    Ok(payload.into())
}

fn main() {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        taskplat::lambda::run(handle);
    }
    std::process::exit(taskplat::serve(handle));
}
