//! `serve(handler)`: the worker wrapper's side of the operator protocol (docs/contracts.md,
//! "Operator protocol"): a task JSON line in, event/step/records lines and one envelope line out.
//!
//! Invariants:
//!  * every task line on stdin is answered with exactly one envelope line on stdout; a line that
//!    is not a task (not JSON, or not the `TaskLine` shape) answers a failed envelope
//!    (`malformed task line: ...`) and serving goes on;
//!  * while it runs, file descriptor 1 points at stderr, so a stray `println!` cannot corrupt
//!    the protocol: only the SDK writes protocol lines (on a duplicate of the original stdout);
//!  * when the protocol stream is closed under it (the reader went away), serving stops at
//!    once: no further task runs, and `serve` returns 1.
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::error::Error;
use crate::operator::{run_operator, Channel, Context, Envelope, Task, TaskResult};

/// The worker wrapper's channel: one flushed JSON line on the protocol stream per call.
struct Lines {
    out: Mutex<Box<dyn Write + Send>>,
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
/// when stdin closes, 1 when stdout was closed under it (the process's exit code).
pub fn serve<H>(handler: H) -> i32
where
    H: Fn(&Task, &Context) -> Result<TaskResult, Error>,
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
    H: Fn(&Task, &Context) -> Result<TaskResult, Error>,
    R: BufRead,
{
    let lines = Arc::new(Lines { out: Mutex::new(out) });
    for line in input.lines() {
        let line = match line {
            Ok(line) => line,
            Err(error) => {
                eprintln!("taskplat: cannot read a task line: {}", error);
                return 1;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let envelope = match serde_json::from_str::<Task>(&line) {
            Ok(task) => run_operator(&handler, task, lines.clone()),
            Err(error) => Envelope::failed(&Error::failure(format!("malformed task line: {}", error))),
        };
        let text = serde_json::to_string(&envelope).unwrap_or_else(|_| r#"{"status":"failed"}"#.into());
        if let Err(error) = lines.write(&text) {
            eprintln!("taskplat: stdout is closed ({}): serving stops", error);
            return 1;
        }
    }
    0
}
