"""The dashboard's queue limits in headless Chromium against a real dispatcher: the Queues page
shows each queue's limits and their use; an admin key edits them (save, a refusal naming the
field and changing nothing, clear); a key without `admin` sees them read-only; a task's page
shows its priority."""

from __future__ import annotations

from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from test_dashboard import _wait
from ui_browser import Console

from taskplat.testkit.dispatcher_calls import create_task
from taskplat.testkit.dispatcher_harness import API_KEY, Dispatcher


def _log_in(browser: webdriver.Chrome, dispatcher: Dispatcher, key: str) -> None:
    browser.get(f"{dispatcher.base_url}/ui/")
    _wait(browser, "#api-key").send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    _wait(browser, "#throughput")


def _fill(browser: webdriver.Chrome, values: dict[str, str]) -> None:
    for name, value in values.items():
        field = browser.find_element(By.ID, f"limit-{name}")
        field.clear()
        if value:
            field.send_keys(value)


def _limits(dispatcher: Dispatcher, queue: str) -> dict[str, object]:
    limits: dict[str, object] = dispatcher.api.get(f"/queues/{queue}").json()["limits"]
    return limits


def test_an_admin_edits_a_queues_limits_and_others_see_them(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher, artifacts: Path
) -> None:
    task = create_task(dispatcher, queue="alpha", priority=2)
    _log_in(browser, dispatcher, API_KEY)
    browser.get(f"{dispatcher.base_url}/ui/#/queues")
    _wait(browser, "span.limits[data-queue=alpha]", "none")
    _wait(browser, "button[data-queue=alpha][data-action=limits]").click()
    _wait(browser, "#limits-form[data-queue=alpha]")
    _fill(browser, {"concurrency": "3", "key-concurrency": "1", "rate": "10", "burst": "5"})
    browser.find_element(By.ID, "limits-save").click()
    _wait(browser, "span.limits[data-queue=alpha]", "0 of 3 running")
    text = browser.find_element(By.CSS_SELECTOR, "span.limits[data-queue=alpha]").text
    assert "1 per key" in text and "10/s, burst 5" in text
    assert _limits(dispatcher, "alpha") == {
        "concurrency_limit": 3, "key_concurrency_limit": 1,
        "rate_limit": {"per_second": 10.0, "burst": 5},
    }  # fmt: skip
    assert not browser.find_elements(By.ID, "limits-form")  # closed once saved
    browser.save_screenshot(str(artifacts / "queue-limits.png"))

    # A rate without its burst: the API refuses it naming the field, and nothing changes.
    browser.find_element(By.CSS_SELECTOR, "button[data-queue=alpha][data-action=limits]").click()
    _wait(browser, "#limits-form[data-queue=alpha]")
    _fill(browser, {"burst": ""})
    browser.find_element(By.ID, "limits-save").click()
    assert "rate_limit.burst" in _wait(browser, "#toast.error", "422").text
    assert _limits(dispatcher, "alpha")["rate_limit"] == {"per_second": 10.0, "burst": 5}

    browser.find_element(By.ID, "limits-clear").click()
    _wait(browser, "span.limits[data-queue=alpha]", "none")
    assert _limits(dispatcher, "alpha") == {
        "concurrency_limit": None, "key_concurrency_limit": None, "rate_limit": None,
    }  # fmt: skip

    browser.get(f"{dispatcher.base_url}/ui/#/task/{task['task_id']}")
    assert "2 (0 first, 9 last)" in _wait(browser, "dl.kv", "Priority").text
    assert console.errors(allowed=("/queues/alpha - Failed to load resource",)) == []


def test_a_key_without_admin_sees_the_limits_read_only(
    browser: webdriver.Chrome, console: Console, dispatcher: Dispatcher
) -> None:
    limits = {"concurrency_limit": 2, "rate_limit": {"per_second": 4, "burst": 1}}
    assert dispatcher.api.put("/queues/beta", json=limits).status_code == 200
    made = dispatcher.api.post("/keys", json={"name": "ops", "scopes": ["operate", "read"]})
    _log_in(browser, dispatcher, made.json()["key"])
    browser.get(f"{dispatcher.base_url}/ui/#/queues")
    text = _wait(browser, "span.limits[data-queue=beta]", "of 2 running").text
    assert "4/s, burst 1 (1 left)" in text
    _wait(browser, "button[data-queue=beta][data-action=pause]")  # operate: pause, not limits
    assert not browser.find_elements(By.CSS_SELECTOR, "button[data-action=limits]")
    assert not browser.find_elements(By.ID, "limits-form")
    assert console.errors() == []
