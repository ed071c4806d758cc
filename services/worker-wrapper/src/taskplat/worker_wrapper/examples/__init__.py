"""Example operators shipped with the wrapper and configured by the default `operators.yaml`:
`echo` (pooled), `sleep` and `fail` (per-task)."""
