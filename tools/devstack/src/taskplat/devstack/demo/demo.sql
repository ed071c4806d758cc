-- Queries of `make demo` (taskplat.devstack.demo): read-only progress of its private database.

-- name: progress
SELECT count(*) FILTER (WHERE status IN ('Completed', 'Dead', 'Canceled'))::int AS finished,
       count(*)::int AS total
FROM tasks;
