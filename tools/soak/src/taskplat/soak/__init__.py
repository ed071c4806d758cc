"""`make soak`: a steady load through a private stack for a long time, sampling each service's
resources and Postgres's tables, failing when one of them grows without bound (see run.py)."""
