//! The Taskplat operator runtime for Rust: one handler for the worker wrapper (`serve`: the task
//! as a JSON line on stdin, events and the result as JSON lines on stdout) and for AWS Lambda's
//! `provided` runtimes (`lambda::run`: the Runtime API loop, reporting to the dispatcher with the
//! attempt token of each invocation). Depends on serde, serde_json and ureq only.
//!
//! ```no_run
//! use serde_json::json;
//! use taskplat::{emit_event, Error, Task, TaskResult};
//!
//! fn handle(task: &Task) -> Result<TaskResult, Error> {
//!     emit_event(json!({"output_index": 0, "cursor": 42}))?;
//!     Ok(json!({"rows": 42}).into())
//! }
//!
//! fn main() {
//!     if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
//!         taskplat::lambda::run(handle); // a `bootstrap` on provided.al2023
//!     }
//!     std::process::exit(taskplat::serve(handle)); // an operators.yaml command
//! }
//! ```
pub mod dispatcher;
pub mod lambda;
mod operator;
mod query;

pub use operator::{
    emit_event, emit_events, publish_records, resolve_event, run_operator, serve, serve_lines, step, Channel, Error,
    PermanentFailure, Task, TaskResult, RECORDS_LINE_BYTES,
};
pub use query::{query, QueryColumn, QueryResult, CAPABILITY_TOKEN_ENV, QUERY_URL_ENV};

/// The README's examples, compiled by `cargo test`.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
