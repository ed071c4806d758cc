"""The dashboard at `/ui/` in headless Chromium against a real dispatcher: log in with the key,
see tasks, open a dead task and replay it, replay all, pause and resume a queue, and the
DAG and dataset views' clear state when the dispatcher has no such routes; a queue the relay holds
(its SQS queue missing) shows as such; no console errors."""

from __future__ import annotations

from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.wait import WebDriverWait
from ui_browser import Console

from taskplat.testkit.dispatcher_calls import claimed, complete, create_task, emit_events
from taskplat.testkit.dispatcher_harness import API_KEY, Dispatcher
from taskplat.testkit.loops_rows import LoopRows

ROOT = Path(__file__).resolve().parents[2]
README_SCREENSHOT = ROOT / "docs" / "images" / "dashboard.png"


def _wait(driver: webdriver.Chrome, css: str, text: str | None = None) -> WebElement:
    wait = WebDriverWait(driver, 15)
    if text is not None:
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
    element: WebElement = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))
    return element


def _dead(dispatcher: Dispatcher, **fields: object) -> str:
    task = create_task(dispatcher, max_attempts=1, **fields)
    lease = claimed(dispatcher, task["task_id"])
    failed = complete(dispatcher, lease, "Failed", error_message="ValueError: bad block 42")
    assert failed.status_code == 200, failed.text
    return str(task["task_id"])


def _seed(dispatcher: Dispatcher) -> dict[str, str]:
    done = create_task(dispatcher, operator="block_follower", config={"chain": "monad"})
    lease = claimed(dispatcher, done["task_id"])
    assert complete(dispatcher, lease, result={"blocks": 120}).status_code == 200
    for _ in range(3):
        create_task(dispatcher, queue="alpha", operator="transform")
    claimed(dispatcher, create_task(dispatcher, queue="beta", operator="index")["task_id"])
    return {
        "completed": str(done["task_id"]),
        "dead": _dead(dispatcher, operator="transform", queue="alpha"),
        "other_dead": _dead(dispatcher, operator="index", queue="beta"),
    }


def _log_in(browser: webdriver.Chrome, dispatcher: Dispatcher) -> None:
    browser.get(f"{dispatcher.base_url}/ui/")
    key = _wait(browser, "#api-key")
    key.send_keys(API_KEY)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    _wait(browser, "#throughput")


def test_log_in_see_tasks_replay_a_dead_task_and_pause_a_queue(
    browser: webdriver.Chrome,
    console: Console,
    dispatcher: Dispatcher,
    artifacts: Path,
    db_url: str,
) -> None:
    tasks = _seed(dispatcher)
    _log_in(browser, dispatcher)
    assert browser.execute_script("return sessionStorage.getItem('taskplat.apiKey')") == API_KEY
    queued = browser.find_element(By.CSS_SELECTOR, ".card[data-state=Queued] .n").text
    assert queued == "3"
    assert browser.find_element(By.CSS_SELECTOR, ".card[data-state=Dead] .n").text == "2"
    browser.save_screenshot(str(artifacts / "overview.png"))  # README's: test_dashboard_live

    browser.get(f"{dispatcher.base_url}/ui/#/tasks")
    _wait(browser, f"a[href='#/task/{tasks['completed']}']")
    rows = browser.find_elements(By.CSS_SELECTOR, "main tbody tr")
    assert len(rows) == 7
    browser.save_screenshot(str(artifacts / "tasks.png"))

    browser.get(f"{dispatcher.base_url}/ui/#/dead")
    _wait(browser, f"a[href='#/task/{tasks['dead']}']")
    browser.find_element(By.CSS_SELECTOR, f"a[href='#/task/{tasks['dead']}']").click()
    _wait(browser, "#task-id", tasks["dead"])
    browser.save_screenshot(str(artifacts / "dead-task.png"))
    assert "ValueError: bad block 42" in _wait(browser, "#last-error").text
    _wait(browser, "#timeline")
    browser.save_screenshot(str(artifacts / "dead-task.png"))
    browser.find_element(By.ID, "replay").click()
    _wait(browser, "dl.kv", "Queued")
    assert dispatcher.api.get(f"/tasks/{tasks['dead']}").json()["status"] == "Queued"
    browser.save_screenshot(str(artifacts / "replayed-task.png"))

    rows = LoopRows(db_url)  # the relay holds beta: its SQS queue does not exist
    try:
        rows.set_queue_sqs_missing("beta", True)
    finally:
        rows.close()
    browser.get(f"{dispatcher.base_url}/ui/#/queues")
    assert "missing" in _wait(browser, ".sqs-missing", "missing").text
    assert len(browser.find_elements(By.CSS_SELECTOR, ".sqs-missing")) == 1
    pause = _wait(browser, "button[data-queue=alpha][data-action=pause]")
    pause.click()
    _wait(browser, "button[data-queue=alpha][data-action=resume]")
    queues = {q["name"]: q for q in dispatcher.api.get("/queues").json()["queues"]}
    assert queues["alpha"]["paused"] is True and queues["beta"]["paused"] is False
    browser.save_screenshot(str(artifacts / "queues.png"))
    browser.find_element(By.CSS_SELECTOR, "button[data-queue=alpha][data-action=resume]").click()
    _wait(browser, "button[data-queue=alpha][data-action=pause]")
    assert not dispatcher.api.get("/queues").json()["queues"][0]["paused"]

    assert console.errors() == []


def test_replay_all(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher, artifacts: Path
) -> None:
    dead = [_dead(dispatcher) for _ in range(3)]
    _log_in(browser, dispatcher)
    browser.get(f"{dispatcher.base_url}/ui/#/dead")
    _wait(browser, f"a[href='#/task/{dead[0]}']")
    browser.find_element(By.ID, "replay-all").click()
    WebDriverWait(browser, 15).until(ec.alert_is_present()).accept()
    _wait(browser, ".empty", "No dead tasks.")
    statuses = {dispatcher.api.get(f"/tasks/{t}").json()["status"] for t in dead}
    assert statuses == {"Queued"}
    assert console.errors() == []


PIPELINE = {
    "jobs": {
        "follow": {"operator": "emit", "outputs": [{"index": 0, "dataset": "blocks"}]},
        "transform": {"operator": "emit",
                      "inputs": [{"from": {"job": "follow", "output_index": 0}}],
                      "outputs": [{"index": 0, "dataset": "enriched"}]},
    }
}  # fmt: skip


def test_dags_as_graphs_and_datasets_with_versions_and_events(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher, artifacts: Path
) -> None:
    d = dispatcher
    assert d.api.put("/dags/pipe", json=PIPELINE).status_code == 201
    run = d.api.post("/dags/pipe/jobs/follow/runs", json={}).json()
    lease = claimed(d, run["task_id"])
    blocks = next(x for x in d.api.get("/datasets").json()["datasets"] if x["name"] == "blocks")
    event = {"dataset_uuid": blocks["dataset_uuid"],
             "dataset_version": blocks["current_version"], "cursor": 77}  # fmt: skip
    assert emit_events(d, lease, [event]).status_code == 200
    _log_in(browser, d)
    browser.get(f"{d.base_url}/ui/#/dags")
    _wait(browser, "main table", "pipe")
    browser.get(f"{d.base_url}/ui/#/dag/pipe")
    graph = _wait(browser, "#dag-graph svg")
    assert "follow" in graph.text and "transform" in graph.text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#dag-graph line")) == 1
    browser.save_screenshot(str(artifacts / "dag.png"))
    browser.get(f"{d.base_url}/ui/#/datasets")
    _wait(browser, "main table", "enriched")
    browser.get(f"{d.base_url}/ui/#/dataset/{blocks['dataset_uuid']}")
    _wait(browser, "main", "77")
    _wait(browser, "main", blocks["current_version"])
    browser.save_screenshot(str(artifacts / "dataset.png"))
    browser.get(f"{d.base_url}/ui/#/task/{run['task_id']}")
    _wait(browser, "#task-events", "77")
    assert console.errors() == []


def test_a_wrong_key_is_refused_and_nothing_is_kept(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher
) -> None:
    browser.get(f"{dispatcher.base_url}/ui/")
    _wait(browser, "#api-key").send_keys("not-the-key-0123456789")
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    _wait(browser, "#login-error", "refused")
    assert browser.execute_script("return sessionStorage.getItem('taskplat.apiKey')") is None
    assert console.errors(allowed=("/queues - Failed to load resource",)) == []


def test_a_dataset_is_rolled_back_from_its_page_after_a_confirmation(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher, artifacts: Path
) -> None:
    d = dispatcher
    assert d.api.put("/dags/pipe", json=PIPELINE).status_code == 201
    blocks = next(x for x in d.api.get("/datasets").json()["datasets"] if x["name"] == "blocks")
    uuid, v1 = blocks["dataset_uuid"], blocks["current_version"]
    v2 = d.api.post(f"/datasets/{uuid}/versions", json={}).json()["dataset"]["current_version"]
    _log_in(browser, d)
    browser.get(f"{d.base_url}/ui/#/dataset/{uuid}")
    button = _wait(browser, f"#dataset-versions button.rollback[data-version='{v1}']")
    assert browser.find_elements(By.CSS_SELECTOR, "#dataset-versions button.rollback") == [button]
    button.click()
    WebDriverWait(browser, 15).until(ec.alert_is_present()).dismiss()  # nothing happens
    assert d.api.get(f"/datasets/{uuid}").json()["current_version"] == v2
    button.click()
    WebDriverWait(browser, 15).until(ec.alert_is_present()).accept()
    _wait(browser, f"#dataset-versions button.rollback[data-version='{v2}']")
    _wait(browser, "#toast", "Rolled back")
    view = d.api.get(f"/datasets/{uuid}").json()
    assert view["current_version"] == v1 and view["versions"][0]["became_current"] == "rollback"
    assert "rollback" in _wait(browser, "#dataset-versions").text
    browser.save_screenshot(str(artifacts / "dataset-rolled-back.png"))
    assert console.errors() == []
