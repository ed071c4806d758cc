//! The Taskplat operator runtime for Rust: one handler for the worker wrapper (`serve`: the task
//! as a JSON line on stdin, events and the result as JSON lines on stdout) and for AWS Lambda's
//! `provided` runtimes (`lambda::run`: the Runtime API loop, reporting to the dispatcher with the
//! attempt token of each invocation). Depends on serde, serde_json and ureq only. The handler
//! gets the task and a `Context` (events, steps, records, queries; usable from threads it
//! spawns); `Task` and `Envelope` are generated from the contracts' JSON Schema (`contract`).
//!
//! ```no_run
//! use serde_json::json;
//! use taskplat::{Context, Error, Task, TaskResult};
//!
//! fn handle(task: &Task, ctx: &Context) -> Result<TaskResult, Error> {
//!     ctx.emit_event(json!({"output_index": 0, "cursor": 42}))?;
//!     Ok(json!({"rows": 42, "attempt": task.attempt}).into())
//! }
//!
//! fn main() {
//!     if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
//!         taskplat::lambda::run(handle); // a `bootstrap` on provided.al2023
//!     }
//!     std::process::exit(taskplat::serve(handle)); // an operators.yaml command
//! }
//! ```
pub mod contract;
pub mod dispatcher;
mod error;
mod finite;
pub mod lambda;
mod operator;
mod query;
mod serve;

pub use error::{Error, PermanentFailure};
pub use operator::{
    resolve_event, run_operator, Channel, Context, Envelope, Task, TaskResult, EVENT_MAX_BYTES, NOT_FINITE,
    RECORDS_LINE_BYTES,
};
pub use query::{QueryColumn, QueryResult, CAPABILITY_TOKEN_ENV, QUERY_URL_ENV};
pub use serve::{serve, serve_lines};

/// The README's examples, compiled by `cargo test`.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
