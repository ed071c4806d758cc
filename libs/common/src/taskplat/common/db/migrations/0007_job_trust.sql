-- A job's trust reaches its tasks' claims: `trust: untrusted` on a job makes each claim of its
-- tasks carry a capability token and run the operator as the untrusted user.
--
-- Invariant: the trust of a task is read from its job at claim time (like its outputs), so a DAG
-- re-applied with another trust applies to the next claim; a task of no job, or of a job no longer
-- applied, is trusted unless its operator is listed as untrusted in the dispatcher's settings.

CREATE FUNCTION taskplat_job_trust(job jsonb) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN job IS NULL THEN 'trusted' ELSE coalesce((
        SELECT j.trust FROM jobs AS j
        WHERE j.dag_name = job ->> 'dag_name' AND j.name = job ->> 'name'), 'trusted') END
$$;
