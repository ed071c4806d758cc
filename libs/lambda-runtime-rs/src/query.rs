//! `Context::query(sql, params, max_rows)`: read the datasets of the task's capability token
//! through the Query Service (`POST {TASKPLAT_QUERY_URL}/query`, the capability token as bearer
//! credential).
//!
//! Invariants: the token is the running attempt's (Lambda: the invocation's `capability_token`),
//! else `TASKPLAT_CAPABILITY_TOKEN` (the wrapper sets it for untrusted tasks); the body is
//! `{sql, params?, max_rows?, format: "json"}`; any answer but 200 is an `Error::failure` naming
//! the service's `error` and `message` (an uncaught one fails the task with that message).
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::dispatcher::{agent, body_of};
use crate::error::Error;

pub const QUERY_URL_ENV: &str = "TASKPLAT_QUERY_URL";
pub const CAPABILITY_TOKEN_ENV: &str = "TASKPLAT_CAPABILITY_TOKEN";

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct QueryColumn {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
}

/// The Query Service's JSON answer.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct QueryResult {
    pub columns: Vec<QueryColumn>,
    pub rows: Vec<Vec<Value>>,
    pub row_count: u64,
    pub truncated: bool,
    pub elapsed_ms: f64,
}

/// Run one read-only SQL statement over the datasets of the capability token: the running
/// attempt's (`channel_token`), else `TASKPLAT_CAPABILITY_TOKEN`.
pub(crate) fn query_with(
    channel_token: Option<String>,
    traceparent: Option<String>,
    sql: &str,
    params: Option<Vec<Value>>,
    max_rows: Option<u64>,
) -> Result<QueryResult, Error> {
    let url = std::env::var(QUERY_URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| Error::failure(format!("query needs {} (the Query Service's URL)", QUERY_URL_ENV)))?;
    let token = channel_token
        .filter(|t| !t.is_empty())
        .or_else(|| std::env::var(CAPABILITY_TOKEN_ENV).ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::failure("query needs the task's capability token (untrusted jobs have one)"))?;
    let mut body = json!({"sql": sql});
    if let Some(params) = params {
        body["params"] = Value::Array(params);
    }
    if let Some(max_rows) = max_rows {
        body["max_rows"] = json!(max_rows);
    }
    body["format"] = json!("json");
    let mut request = agent()
        .post(&format!("{}/query", url.trim_end_matches('/')))
        .set("Authorization", &format!("Bearer {}", token))
        .set("Content-Type", "application/json")
        .set("Accept", "application/json")
        .timeout(Duration::from_secs(300));
    // The query joins the attempt's trace: the task's context, else the process's.
    let traceparent = traceparent.filter(|t| !t.is_empty()).or_else(|| std::env::var("TRACEPARENT").ok());
    if let Some(traceparent) = traceparent.filter(|t| !t.is_empty()) {
        request = request.set("traceparent", &traceparent);
    }
    let answer = request.send_string(&body.to_string());
    match answer {
        Ok(response) if response.status() == 200 => {
            let text = response.into_string()?;
            serde_json::from_str(&text).map_err(|e| Error::failure(format!("query failed: the answer is not a query result: {}", e)))
        }
        Ok(response) => Err(refusal(response.status(), body_of(response))),
        Err(ureq::Error::Status(status, response)) => Err(refusal(status, body_of(response))),
        Err(error) => Err(Error::failure(format!("query failed: {}", error))),
    }
}

fn refusal(status: u16, body: Value) -> Error {
    let what = if status < 500 { "refused" } else { "failed" };
    let field = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_string);
    Error::failure(format!(
        "query {} ({}): {}: {}",
        what,
        status,
        field("error").unwrap_or_else(|| "error".into()),
        field("message").unwrap_or_default()
    ))
}
