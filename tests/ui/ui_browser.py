"""Helpers of the dashboard's browser tests: the browser console's errors.

Invariant: `Console.errors()` returns every SEVERE console entry seen since the browser started
(entries are read once from the driver and kept), minus those naming an allowed text.
"""

from __future__ import annotations

from typing import Any

from selenium import webdriver


class Console:
    """The browser's console errors, read as the test goes."""

    def __init__(self, driver: webdriver.Chrome) -> None:
        self.driver = driver
        self.seen: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        self.seen += self.driver.get_log("browser")
        return self.seen

    def errors(self, allowed: tuple[str, ...] = ()) -> list[str]:
        return [
            entry["message"]
            for entry in self.read()
            if entry["level"] == "SEVERE" and not any(text in entry["message"] for text in allowed)
        ]
