//! The calls a Lambda attempt makes to the dispatcher, with its attempt token.
//!
//! Invariants: every call names the attempt's `(task_id, attempt, lease_token)` and carries the
//! attempt token as its bearer credential, never the worker token; a 4xx answer (401 bad token,
//! 403 another attempt, 404 no task, 409 stale attempt or lease) is `CallError::Refused`, which
//! is final: the attempt no longer holds the task; a transport error or a 5xx is retried with a
//! doubling delay while the caller's time allows, then is `CallError::Unreachable`.
use std::time::Duration;

use serde_json::{json, Map, Value};

pub const USER_AGENT: &str = "taskplat-lambda-runtime-rs/0.1";

#[derive(Debug)]
pub enum CallError {
    /// The dispatcher refused the call for this attempt: `reason` from its body.
    Refused { status: u16, reason: String, body: Value },
    /// The dispatcher did not answer in time.
    Unreachable(String),
}

/// The JSON object of an answer's body (`{}` when it has none).
pub(crate) fn body_of(response: ureq::Response) -> Value {
    let text = response.into_string().unwrap_or_default();
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(fields)) => Value::Object(fields),
        _ => json!({}),
    }
}

pub(crate) fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().user_agent(USER_AGENT).build()
}

pub struct AttemptApi {
    url: String,
    token: String,
    fence: Map<String, Value>,
    seconds_left: Box<dyn Fn() -> f64 + Send + Sync>,
    agent: ureq::Agent,
}

impl AttemptApi {
    pub fn new(
        url: &str,
        token: &str,
        task_id: &str,
        attempt: i64,
        lease_token: &str,
        seconds_left: Box<dyn Fn() -> f64 + Send + Sync>,
    ) -> AttemptApi {
        let mut fence = Map::new();
        fence.insert("task_id".into(), json!(task_id));
        fence.insert("attempt".into(), json!(attempt));
        fence.insert("lease_token".into(), json!(lease_token));
        AttemptApi { url: url.trim_end_matches('/').to_string(), token: token.to_string(), fence, seconds_left, agent: agent() }
    }

    pub fn seconds_left(&self) -> f64 {
        (self.seconds_left)()
    }

    pub fn heartbeat(&self) -> Result<Value, CallError> {
        self.post("/internal/heartbeat", Map::new())
    }

    pub fn events(&self, events: Vec<Value>) -> Result<Value, CallError> {
        let mut body = Map::new();
        body.insert("events".into(), Value::Array(events));
        self.post("/internal/events", body)
    }

    /// Record a step's result; the one that stands (the first recorded).
    pub fn step(&self, name: &str, result: Value) -> Result<Value, CallError> {
        let mut body = Map::new();
        body.insert("step".into(), json!(name));
        body.insert("result".into(), result);
        Ok(self.post("/internal/steps", body)?.get("result").cloned().unwrap_or(Value::Null))
    }

    /// Complete the attempt; fields that are null, empty or an empty string are not sent (as
    /// the other runtimes); `false` is.
    pub fn complete(&self, status: &str, fields: Map<String, Value>) -> Result<Value, CallError> {
        let mut body = Map::new();
        body.insert("status".into(), json!(status));
        for (key, value) in fields {
            let sent = match &value {
                Value::Null => false,
                Value::String(s) => !s.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::Object(o) => !o.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::Bool(_) => true,
            };
            if sent {
                body.insert(key, value);
            }
        }
        self.post("/internal/task-complete", body)
    }

    fn post(&self, path: &str, body: Map<String, Value>) -> Result<Value, CallError> {
        let mut sent = self.fence.clone();
        sent.extend(body);
        let data = Value::Object(sent).to_string();
        let mut delay = 0.2_f64;
        loop {
            let timeout = self.seconds_left().min(10.0).max(0.5);
            let answer = self
                .agent
                .post(&format!("{}{}", self.url, path))
                .set("Authorization", &format!("Bearer {}", self.token))
                .set("Content-Type", "application/json")
                .set("Accept", "application/json")
                .timeout(Duration::from_secs_f64(timeout))
                .send_string(&data);
            let problem = match answer {
                Ok(response) => return Ok(body_of(response)),
                Err(ureq::Error::Status(status, response)) if status < 500 => {
                    let body = body_of(response);
                    let reason = ["reason", "error"]
                        .iter()
                        .find_map(|key| body.get(*key).and_then(Value::as_str))
                        .map(str::to_string)
                        .unwrap_or_else(|| status.to_string());
                    return Err(CallError::Refused { status, reason, body });
                }
                Err(ureq::Error::Status(status, _)) => format!("{} answered {}", path, status),
                Err(error) => format!("{}: {}", path, error),
            };
            if self.seconds_left() <= delay + 0.5 {
                return Err(CallError::Unreachable(format!("cannot reach the dispatcher at {}: {}", self.url, problem)));
            }
            std::thread::sleep(Duration::from_secs_f64(delay)); // a retry pause, bounded by the time left
            delay = (delay * 2.0).min(5.0);
        }
    }
}

/// Seconds since the Unix epoch of an RFC 3339 timestamp (`2026-01-02T03:04:05.678+00:00`, `Z`).
pub fn parse_rfc3339(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b't' || b[10] == b' ') {
        return None;
    }
    let num = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &text[19..];
    let mut fraction = 0.0;
    if let Some(digits) = rest.strip_prefix('.') {
        let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
        fraction = format!("0.{}", &digits[..end]).parse::<f64>().ok()?;
        rest = &digits[end..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 => {
            let sign = match &rest[..1] { "+" => 1, "-" => -1, _ => return None };
            sign * (rest[1..3].parse::<i64>().ok()? * 3600 + rest[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    // Days from the civil date (proleptic Gregorian), as in Howard Hinnant's algorithm.
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hour * 3600 + minute * 60 + second - offset) as f64 + fraction)
}

pub fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::parse_rfc3339;

    #[test]
    fn rfc3339_timestamps_parse_to_unix_seconds() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_rfc3339("2026-11-27T08:00:00+00:00"), Some(1_795_766_400.0));
        assert_eq!(parse_rfc3339("2026-11-27T09:00:00.5+01:00"), Some(1_795_766_400.5));
        assert_eq!(parse_rfc3339("not a time"), None);
    }
}
