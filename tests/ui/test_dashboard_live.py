"""The live dashboard in headless Chromium: a page refreshes on its own when a task completes,
search finds a task by idempotency key, the Workers and Audit pages, a refused Cancel (409) shows
the API's message, "Replay all" honours the page's filters, a read-only key sees no action
button, and every page runs under the Content-Security-Policy with no console error."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.wait import WebDriverWait
from test_dashboard import README_SCREENSHOT, _dead, _log_in, _seed, _wait
from ui_browser import Console

from taskplat.testkit.dispatcher_calls import claimed, complete, create_task
from taskplat.testkit.dispatcher_harness import Dispatcher

WORKERS_SCREENSHOT = README_SCREENSHOT.with_name("dashboard-workers.png")


def _log_in_with(browser: webdriver.Chrome, dispatcher: Dispatcher, key: str) -> None:
    browser.get(f"{dispatcher.base_url}/ui/")
    _wait(browser, "#api-key").send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    _wait(browser, "#throughput")


def _report(dispatcher: Dispatcher, worker_id: str, queue: str, running: list[str]) -> None:
    body = {"worker_id": worker_id, "queue": queue, "max": 1, "wait_seconds": 0,
            "worker": {"worker_id": worker_id, "queues": [queue], "slots": 4,
                       "version": "0.1.0", "running": running}}  # fmt: skip
    assert dispatcher.worker.post("/internal/task-claim-next", json=body).status_code == 200


def test_live_pages_search_workers_and_audit_under_the_csp(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher, artifacts: Path
) -> None:
    d = dispatcher
    page = d.anonymous.get("/ui/")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    _seed(d)
    running = create_task(d, queue="alpha", operator="transform", idempotency_key="order-42")
    lease = claimed(d, running["task_id"], worker_id="worker-a1")
    _report(d, "worker-a1", "alpha", [running["task_id"]])
    assert d.api.put("/queues/beta/pause").status_code == 200
    _log_in(browser, d)
    _wait(browser, "#workers-card .n", "1")
    assert "Live" in browser.find_element(By.ID, "live").text

    # Search by idempotency key opens the task; the page follows it to Completed on its own.
    search = browser.find_element(By.ID, "search-input")
    search.send_keys("order-42", Keys.ENTER)
    _wait(browser, "#task-id", running["task_id"])
    details = _wait(browser, "dl.kv", "Running")
    browser.execute_script("window.scrollTo(0, 150)")
    scrolled = browser.execute_script("return window.scrollY")
    assert scrolled > 0
    assert complete(d, lease, result={"ok": True}).status_code == 200
    _wait(browser, "dl.kv", "Completed")  # no reload: the live refresh
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1
    # The refresh rewrote what changed in place: same element, same scroll position.
    assert "Completed" in details.text
    assert browser.execute_script("return window.scrollY") == scrolled

    browser.get(f"{d.base_url}/ui/#/")
    _wait(browser, "#throughput")
    browser.save_screenshot(str(artifacts / "overview.png"))
    browser.get(f"{d.base_url}/ui/#/workers")
    _wait(browser, "main table", "worker-a1")
    assert "alive" in browser.find_element(By.CSS_SELECTOR, "main tbody tr").text
    browser.save_screenshot(str(artifacts / "workers.png"))
    if os.environ.get("TASKPLAT_UPDATE_SNAPSHOTS") == "1":
        shutil.copyfile(artifacts / "overview.png", README_SCREENSHOT)
        shutil.copyfile(artifacts / "workers.png", WORKERS_SCREENSHOT)
    browser.get(f"{d.base_url}/ui/#/audit")
    _wait(browser, "main table", "pause_queue")
    assert "bootstrap" in browser.find_element(By.CSS_SELECTOR, "main tbody tr").text
    browser.get(f"{d.base_url}/ui/#/tasks")
    _wait(browser, f"a[href='#/task/{running['task_id']}']")
    browser.get(f"{d.base_url}/ui/#/queues")
    _wait(browser, "#register-queue").send_keys("from-the-ui", Keys.ENTER)
    _wait(browser, "main table", "from-the-ui")
    assert "from-the-ui" in [q["name"] for q in d.api.get("/queues").json()["queues"]]
    assert console.errors() == []


def test_a_refused_cancel_shows_its_message_and_replay_all_honours_the_filters(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher
) -> None:
    d = dispatcher
    task = create_task(d)
    lease = claimed(d, task["task_id"])
    in_alpha = _dead(d, queue="alpha")
    in_beta = _dead(d, queue="beta")
    _log_in(browser, d)
    browser.get(f"{d.base_url}/ui/#/task/{task['task_id']}")
    _wait(browser, "dl.kv", "Running")
    browser.find_element(By.ID, "live").click()  # paused: the Cancel button stays
    _wait(browser, "#live", "Paused")
    assert complete(d, lease).status_code == 200
    browser.find_element(By.ID, "cancel").click()
    WebDriverWait(browser, 15).until(ec.alert_is_present()).accept()
    toast = _wait(browser, "#toast.error", "can no longer be canceled")
    assert "409" in toast.text and toast.get_attribute("role") == "alert"

    browser.get(f"{d.base_url}/ui/#/dead?queue=alpha")
    _wait(browser, f"a[href='#/task/{in_alpha}']")
    button = _wait(browser, "#replay-all", "queue alpha")
    button.click()
    alert = WebDriverWait(browser, 15).until(ec.alert_is_present())
    assert "queue alpha" in alert.text
    alert.accept()
    _wait(browser, ".empty", "No dead tasks.")
    assert d.api.get(f"/tasks/{in_alpha}").json()["status"] == "Queued"
    assert d.api.get(f"/tasks/{in_beta}").json()["status"] == "Dead"
    assert console.errors(allowed=("/cancel - Failed to load resource",)) == []


def test_a_read_only_key_sees_no_action_button(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher
) -> None:
    d = dispatcher
    dead = _dead(d, queue="alpha")
    queued = create_task(d)["task_id"]
    made = d.api.post("/keys", json={"name": "dashboard", "scopes": ["read"]})
    _log_in_with(browser, d, made.json()["key"])
    browser.get(f"{d.base_url}/ui/#/dead")
    _wait(browser, f"a[href='#/task/{dead}']")
    assert browser.find_elements(By.CSS_SELECTOR, "#replay-all, button.replay") == []
    browser.get(f"{d.base_url}/ui/#/task/{dead}")
    _wait(browser, "#task-id", dead)
    browser.get(f"{d.base_url}/ui/#/task/{queued}")
    _wait(browser, "#task-id", queued)
    assert browser.find_elements(By.CSS_SELECTOR, "#replay, #cancel") == []
    browser.get(f"{d.base_url}/ui/#/queues")
    _wait(browser, "main table", "alpha")
    assert browser.find_elements(By.CSS_SELECTOR, "button[data-queue], #register") == []
    # The audit log needs admin: its link is hidden.
    assert not browser.find_element(By.CSS_SELECTOR, "nav a[href='#/audit']").is_displayed()
    assert console.errors() == []
