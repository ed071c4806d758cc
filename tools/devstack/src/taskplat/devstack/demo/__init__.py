"""`make demo`: a private stack, 1,000 tasks, a three-job pipeline, the same pipeline in three
languages (wrapper and Lambda) and an untrusted join through the query service.

Modules: `run` (the whole demo, `run_demo`), `pipeline`, `polyglot`, `query` (with its untrusted
operators in `query_ops`). Invariants: a demo only drives the platform through its public API and
the local runtime; it stops every process it started.
"""
