//! The worker wrapper's protocol (`serve_lines`): one envelope line per task line, events resolved
//! from the task's outputs, steps, records, failures, malformed lines and non-finite results;
//! the context used from a spawned thread; a closed protocol stream stops serving.
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use taskplat::{serve_lines, Context, Error, PermanentFailure, Task, TaskResult, EVENT_MAX_BYTES};

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A protocol stream whose reader went away.
struct Closed;

impl Write for Closed {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "Broken pipe"))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn handle(task: &Task, ctx: &Context) -> Result<TaskResult, Error> {
    match task.config.get("do").and_then(Value::as_str) {
        Some("fail") => Err(Error::failure("asked to fail")),
        Some("permanent") => Err(PermanentFailure("never again".into()).into()),
        Some("parse") => Ok(json!({"n": "x".parse::<i32>()?}).into()),
        Some("panic") => panic!("it broke"),
        Some("records") => Ok(json!({"n": ctx.publish_records(json!("buffered"), &[json!({"org_id": "o", "dedupe_key": "k"})])?}).into()),
        Some("thread") => {
            let emitter = ctx.clone();
            let attempt = task.attempt;
            std::thread::spawn(move || emitter.emit_event(json!({"output_index": 0, "cursor": attempt * 10})))
                .join()
                .unwrap()?;
            Ok(json!({"threaded": true}).into())
        }
        Some("big") => {
            ctx.emit_event(json!({"output_index": 0, "partition_key": "x".repeat(EVENT_MAX_BYTES)}))?;
            Ok(json!({}).into())
        }
        Some("nan") => {
            let mut typed = BTreeMap::new();
            typed.insert("ratio", f64::NAN);
            TaskResult::payload(&typed)
        }
        _ => {
            ctx.emit_event(json!({"output_index": 0, "cursor": task.attempt}))?;
            Ok(json!({"first": ctx.step("first", || Ok(json!(task.attempt)))?}).into())
        }
    }
}

fn line(config: &Value) -> String {
    let output = json!({"output_index": 0, "dataset_uuid": "d-1", "dataset_version": "v-1", "location": "x",
                        "dataset": "buffered", "kind": "buffered_postgres"});
    json!({"task_id": "t-1", "attempt": 2, "lease_token": "l", "operator": "op", "queue": "default",
           "config": config, "inputs": [], "job": null, "timeout_seconds": null, "deadline_at": null,
           "outputs": [output]})
    .to_string()
}

fn served(input: &str) -> Vec<Value> {
    let sink = Sink::default();
    assert_eq!(serve_lines(handle, input.as_bytes(), Box::new(sink.clone())), 0);
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

fn answers(configs: &[Value]) -> Vec<Value> {
    served(&configs.iter().map(|config| line(config) + "\n\n").collect::<String>())
}

#[test]
fn serve_speaks_the_wrapper_protocol() {
    assert_eq!(
        answers(&[json!({}), json!({"do": "fail"}), json!({"do": "permanent"})]),
        vec![
            json!({"event": {"dataset_uuid": "d-1", "dataset_version": "v-1", "cursor": 2}}),
            json!({"step": {"name": "first", "result": 2}}),
            json!({"status": "succeeded", "payload": {"first": 2}}),
            json!({"status": "failed", "error": "asked to fail"}),
            json!({"status": "failed", "retryable": false, "error": "never again"}),
        ]
    );
}

#[test]
fn errors_panics_and_records() {
    assert_eq!(
        answers(&[json!({"do": "parse"}), json!({"do": "panic"}), json!({"do": "records"})]),
        vec![
            json!({"status": "failed", "error": "ParseIntError: invalid digit found in string"}),
            json!({"status": "failed", "error": "panic: it broke"}),
            json!({"dataset_uuid": "d-1", "records": [{"org_id": "o", "dedupe_key": "k"}]}),
            json!({"status": "succeeded", "payload": {"n": 1}}),
        ]
    );
}

#[test]
fn a_spawned_thread_emits_through_the_context() {
    assert_eq!(
        answers(&[json!({"do": "thread"})]),
        vec![
            json!({"event": {"dataset_uuid": "d-1", "dataset_version": "v-1", "cursor": 20}}),
            json!({"status": "succeeded", "payload": {"threaded": true}}),
        ]
    );
}

#[test]
fn the_edges_fail_the_task_and_serving_goes_on() {
    let input = format!("not json\n[1]\n{{\"task_id\": \"t\"}}\n{}\n{}\n{}\n", line(&json!({"do": "big"})), line(&json!({"do": "nan"})), line(&json!({})));
    let answered = served(&input);
    assert_eq!(answered.len(), 8, "{:?}", answered);
    for malformed in &answered[..3] {
        assert_eq!(malformed["status"], "failed");
        assert!(malformed["error"].as_str().unwrap().starts_with("malformed task line: "), "{}", malformed);
    }
    assert_eq!(answered[3], json!({"status": "failed", "error": format!("an event is larger than {} bytes of JSON", EVENT_MAX_BYTES)}));
    assert_eq!(answered[4], json!({"status": "failed", "error": "the result is not JSON: NaN or Infinity"}));
    assert_eq!(answered[7], json!({"status": "succeeded", "payload": {"first": 2}}));
}

#[test]
fn a_closed_protocol_stream_stops_serving() {
    let input = format!("{}\n{}\n", line(&json!({"do": "fail"})), line(&json!({"do": "panic"})));
    assert_eq!(serve_lines(handle, input.as_bytes(), Box::new(Closed)), 1);
}

#[test]
fn a_recorded_step_is_not_run_again() {
    let mut later: Value = serde_json::from_str(&line(&json!({}))).unwrap();
    later["attempt"] = json!(3);
    later["steps"] = json!({"first": 1});
    let text = served(&format!("{}\n", later)).iter().map(Value::to_string).collect::<Vec<_>>().join("\n");
    assert!(!text.contains("\"step\""), "{}", text);
    assert!(text.contains("\"first\":1"), "{}", text);
}
