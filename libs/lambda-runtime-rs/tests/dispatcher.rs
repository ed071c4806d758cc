//! The Lambda side against a real dispatcher: TASKPLAT_TEST_DISPATCHER_URL, _API_KEY and
//! _WORKER_TOKEN name it (tests/runtimes/test_runtime_rs.py starts one and runs `cargo test`).
//! Each test claims a task as the relay would for a function, then invokes with the claim.
use std::sync::Arc;

use serde_json::{json, Value};
use taskplat::dispatcher::now_seconds;
use taskplat::lambda::invoke;
use taskplat::{Context, Error, PermanentFailure, Task, TaskResult};

struct Dispatcher {
    url: String,
    api_key: String,
    worker_token: String,
    dag: String,
}

fn dispatcher(dag: &str) -> Option<Dispatcher> {
    let url = std::env::var("TASKPLAT_TEST_DISPATCHER_URL").ok()?;
    let d = Dispatcher {
        url,
        api_key: std::env::var("TASKPLAT_TEST_API_KEY").unwrap_or_default(),
        worker_token: std::env::var("TASKPLAT_TEST_WORKER_TOKEN").unwrap_or_default(),
        dag: format!("{}-{}", dag, std::process::id()),
    };
    let jobs = json!({"jobs": {"rs": {"operator": "rs", "max_attempts": 3,
                                     "outputs": [{"index": 0, "dataset": format!("{}-out", d.dag)}]}}});
    let (status, body) = d.call("PUT", &format!("/dags/{}", d.dag), &d.api_key, Some(jobs));
    assert_eq!(status, 201, "{}", body);
    Some(d)
}

impl Dispatcher {
    fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let request = ureq::request(method, &format!("{}{}", self.url, path))
            .set("Authorization", &format!("Bearer {}", token))
            .set("Content-Type", "application/json");
        let answer = match body {
            Some(body) => request.send_string(&body.to_string()),
            None => request.call(),
        };
        let response = match answer {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => response,
            Err(error) => panic!("{} {}: {}", method, path, error),
        };
        let status = response.status();
        let text = response.into_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn claimed_run(&self, config: Value) -> Value {
        let (status, run) = self.call("POST", &format!("/dags/{}/jobs/rs/runs", self.dag), &self.api_key, Some(json!({"config": config})));
        assert_eq!(status, 201, "{}", run);
        let claim = json!({"task_id": run["task_id"], "worker_id": "rs-runtime-test"});
        let (_, claimed) = self.call("POST", "/internal/task-claim", &self.worker_token, Some(claim));
        assert_eq!(claimed["status"], "Claimed", "{}", claimed);
        claimed
    }

    fn task(&self, task_id: &Value) -> Value {
        self.call("GET", &format!("/tasks/{}", task_id.as_str().unwrap()), &self.api_key, None).1
    }

    fn invoke(&self, claim: &Value) -> Value {
        invoke(Arc::new(handle), claim.clone(), now_seconds() + 30.0, &self.url, 2.0).unwrap().response
    }
}

fn handle(task: &Task, ctx: &Context) -> Result<TaskResult, Error> {
    if let Some(message) = task.config.get("permanent").and_then(Value::as_str) {
        return Err(PermanentFailure(message.to_string()).into());
    }
    if let Some(message) = task.config.get("fail").and_then(Value::as_str) {
        return Err(Error::failure(message));
    }
    // The event goes out from a thread the handler spawns, through its context.
    let emitter = ctx.clone();
    std::thread::spawn(move || emitter.emit_event(json!({"output_index": 0, "cursor": 7}))).join().unwrap()?;
    let first = ctx.step("once", || Ok(json!(task.attempt)))?;
    Ok(json!({"attempt": task.attempt, "once": first}).into())
}

macro_rules! dispatcher_or_skip {
    ($dag:expr) => {
        match dispatcher($dag) {
            Some(d) => d,
            None => {
                eprintln!("skipped: TASKPLAT_TEST_DISPATCHER_URL is not set (tests/runtimes/test_runtime_rs.py sets it)");
                return;
            }
        }
    };
}

#[test]
fn events_steps_and_the_completion_go_through_with_the_attempt_token() {
    let d = dispatcher_or_skip!("rs-ok");
    let claim = d.claimed_run(json!({}));
    let task_id = claim["task"]["task_id"].clone();
    assert_eq!(
        d.invoke(&claim),
        json!({"status": "Accepted", "outcome": "Completed", "task_id": task_id, "attempt": 1, "task_status": "Completed"})
    );
    let done = d.task(&task_id);
    assert_eq!(done["status"], "Completed");
    assert_eq!(done["result"], json!({"attempt": 1, "once": 1}));
    let (_, events) = d.call("GET", &format!("/tasks/{}/events", task_id.as_str().unwrap()), &d.api_key, None);
    assert_eq!(events["events"][0]["cursor"], json!(7));
    assert_eq!(events["events"].as_array().unwrap().len(), 1);
    // The same invocation delivered again is refused at its first heartbeat and runs nothing.
    let again = d.invoke(&claim);
    assert_eq!(again["status"], "Refused");
    assert_eq!(again["reason"], "NotRunning");
}

#[test]
fn a_canceled_attempt_is_refused_before_the_operator_runs() {
    let d = dispatcher_or_skip!("rs-cancel");
    let claim = d.claimed_run(json!({}));
    let task_id = claim["task"]["task_id"].clone();
    let (status, _) = d.call("PUT", &format!("/tasks/{}/cancel", task_id.as_str().unwrap()), &d.api_key, None);
    assert_eq!(status, 200);
    assert_eq!(d.invoke(&claim), json!({"status": "Refused", "reason": "Canceled", "task_id": task_id, "attempt": 1}));
}

#[test]
fn a_permanent_failure_makes_the_task_dead_at_once_and_a_failure_is_retried() {
    let d = dispatcher_or_skip!("rs-fail");
    let claim = d.claimed_run(json!({"permanent": "the input can never be read"}));
    assert_eq!(d.invoke(&claim)["task_status"], "Dead");
    let dead = d.task(&claim["task"]["task_id"]);
    assert!(dead["last_error"].as_str().unwrap().contains("the input can never be read"), "{}", dead);
    let claim = d.claimed_run(json!({"fail": "not yet"}));
    assert_eq!(d.invoke(&claim)["task_status"], "Failed");
}
