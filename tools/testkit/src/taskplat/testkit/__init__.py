"""Taskplat's testkit: what the tests of several packages share.

`fixtures` is the pytest plugin (real Postgres and SQS per session), `testdb` the per-test
databases; the harnesses run a real dispatcher (`dispatcher_harness`, `dispatcher_calls`), set up
rows the public API cannot reach (`dispatcher_rows`, `loops_rows`), publish to a sink's buffer
(`sink_harness`) and build the TypeScript and Rust runtimes (`runtime_builds`).

Invariants: importing this package starts nothing; the testkit imports the local runtime
(`taskplat.devstack`) and the services it drives, never another package's tests.
"""
