"""`make chaos`: tasks through a private stack while SQS loses, duplicates and fails messages,
services are killed and Postgres crashes; then a count of what went wrong (see docs/chaos.md)."""
