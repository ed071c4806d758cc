//! The worker wrapper's protocol (`serve_lines`): one envelope line per task line, events resolved
//! from the task's outputs, steps, records, failures; and the SDK outside a handler.
use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use taskplat::{emit_event, publish_records, serve_lines, step, Error, PermanentFailure, Task, TaskResult};

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

fn handle(task: &Task) -> Result<TaskResult, Error> {
    match task.config.get("do").and_then(Value::as_str) {
        Some("fail") => Err(Error::failure("asked to fail")),
        Some("permanent") => Err(PermanentFailure("never again".into()).into()),
        Some("parse") => Ok(json!({"n": "x".parse::<i32>()?}).into()),
        Some("panic") => panic!("it broke"),
        Some("records") => Ok(json!({"n": publish_records(json!("buffered"), &[json!({"org_id": "o", "dedupe_key": "k"})])?}).into()),
        _ => {
            emit_event(json!({"output_index": 0, "cursor": task.attempt}))?;
            Ok(json!({"first": step("first", || Ok(json!(task.attempt)))?}).into())
        }
    }
}

fn answers(configs: &[Value]) -> Vec<Value> {
    let output = json!({"output_index": 0, "dataset_uuid": "d-1", "dataset_version": "v-1", "location": "x",
                        "dataset": "buffered", "kind": "buffered_postgres"});
    let input: String = configs
        .iter()
        .map(|config| json!({"task_id": "t-1", "attempt": 2, "lease_token": "l", "config": config, "outputs": [output]}).to_string() + "\n\n")
        .collect();
    let sink = Sink::default();
    assert_eq!(serve_lines(handle, input.as_bytes(), Box::new(sink.clone())), 0);
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
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
fn a_recorded_step_is_not_run_again_and_the_sdk_needs_a_handler() {
    let later = json!({"task_id": "t", "attempt": 3, "config": {}, "steps": {"first": 1},
                       "outputs": [{"output_index": 0, "dataset_uuid": "d", "dataset_version": "v"}]});
    let sink = Sink::default();
    serve_lines(handle, format!("{}\n", later).as_bytes(), Box::new(sink.clone()));
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains("\"step\""), "{}", text);
    assert!(text.contains("\"first\":1"), "{}", text);
    assert!(emit_event(json!({"cursor": 1})).is_err());
}
