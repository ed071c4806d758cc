"""Example operator `word-count`: count the words of `config["text"]` (a product team's operator
code, Python).

Run by the worker wrapper as `{python} /opt/taskplat/operators/word_count.py` (operators.yaml):
one task JSON line on stdin, one result envelope line on stdout. It uses the SDK of the base image
(`taskplat.worker_wrapper.sdk`, standard library only), so `{python}` - the wrapper's interpreter -
is the one to run it with. When its job declares an output (a `buffered_postgres` dataset with
columns `word text, n bigint`), it also publishes one record per distinct lower-cased word with
its count, in the organisation `config["org_id"]`.

Invariants: publishing is idempotent (each record's dedupe key is its word, so a retry writes
nothing new); a missing or non-string `text` fails the task with a one-line message
(OperatorFailure), never a traceback.
"""

from __future__ import annotations

from collections import Counter

from taskplat.worker_wrapper.sdk import OperatorFailure, Task, publish_records, serve

DEFAULT_ORG = "00000000-0000-4000-8000-000000000000"


def handle(task: Task) -> dict[str, object]:
    text = task.config.get("text")
    if not isinstance(text, str):
        raise OperatorFailure('config.text must be a string, e.g. {"text": "hello world"}')
    words = text.split()
    counts = Counter(word.lower() for word in words)
    result: dict[str, object] = {"words": len(words), "distinct": len(counts)}
    if task.outputs:
        org_id = str(task.config.get("org_id", DEFAULT_ORG))
        records = [
            {"org_id": org_id, "dedupe_key": word, "word": word, "n": n}
            for word, n in sorted(counts.items())
        ]
        result["published"] = publish_records(0, records)
    return result


if __name__ == "__main__":
    raise SystemExit(serve(handle))
