//! `square`, the example image's Rust operator: for each input event at cursor `c`, one event
//! on output 0 at cursor `c * c`; the payload lists the squares (`{"squares": [...]}`).
//! Run by the worker wrapper as `/opt/taskplat/operators/square` (operators.yaml); the build
//! stage of deploy/worker-example/Dockerfile compiles it from Debian's crates, offline.
//!
//! Invariants: an input without a positive integer cursor, or whose square overflows, fails the
//! task permanently; emitting again on a retry is harmless (an event is stored once per task and
//! position).
use serde_json::{json, Value};
use taskplat::{Context, Error, PermanentFailure, Task, TaskResult};

fn handle(task: &Task, ctx: &Context) -> Result<TaskResult, Error> {
    let mut squares = Vec::new();
    for input in &task.inputs {
        let cursor = input.get("cursor").and_then(Value::as_u64).filter(|c| *c > 0);
        let square = cursor.and_then(|c| c.checked_mul(c)).filter(|s| *s <= i64::MAX as u64);
        let square = match square {
            Some(square) => square,
            None => {
                let message = format!("each input needs a positive integer cursor whose square fits: {}", input);
                return Err(PermanentFailure(message).into());
            }
        };
        ctx.emit_event(json!({"output_index": 0, "cursor": square}))?;
        squares.push(square);
    }
    Ok(json!({ "squares": squares }).into())
}

fn main() {
    std::process::exit(taskplat::serve(handle));
}
