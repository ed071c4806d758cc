"""Example operator: count the words of `config["text"]` (a product team's operator code).

Run by the worker wrapper as `{python} /opt/taskplat/operators/word_count.py` (operators.yaml):
one task JSON line on stdin, one result envelope line on stdout. It uses the SDK of the base image
(`taskplat.worker_wrapper.sdk`, standard library only), so `{python}` - the wrapper's interpreter -
is the one to run it with.

Invariants: no external effects, so nothing to make idempotent; a missing or non-string `text`
fails the task with a one-line message (OperatorFailure), never a traceback.
"""

from __future__ import annotations

from taskplat.worker_wrapper.sdk import OperatorFailure, Task, serve


def handle(task: Task) -> dict[str, object]:
    text = task.config.get("text")
    if not isinstance(text, str):
        raise OperatorFailure('config.text must be a string, e.g. {"text": "hello world"}')
    words = text.split()
    return {"words": len(words), "distinct": len({word.lower() for word in words})}


if __name__ == "__main__":
    raise SystemExit(serve(handle))
