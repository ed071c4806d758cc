-- Access and a view of the fleet: scoped API keys, the audit log of operators' calls, and the
-- workers as they report themselves.
--
-- Invariants:
--   * `api_keys` holds the sha256 of each key's secret, never the secret; a key is found by that
--     hash (a unique index) and carries its scopes (`read`, `submit`, `operate`, `admin`); revoking
--     a key deletes its row. The bootstrap keys of the dispatcher's `api_keys` setting are not
--     stored here.
--   * `audit_log` gets one row per `operate` or `admin` call, written in the transaction of the
--     call's own change: a call that failed (and rolled back) leaves none. Rows are only appended.
--   * `workers` holds one row per wrapper (worker_id), upserted from the reports the wrapper adds
--     to calls it already makes (at most once every few seconds per wrapper); `last_seen` says
--     when it last reported. Rows of workers silent for long are pruned by the dispatcher.

CREATE TABLE api_keys (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    key_hash    bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    scopes      text[] NOT NULL
        CHECK (cardinality(scopes) > 0
               AND scopes <@ ARRAY['read', 'submit', 'operate', 'admin']::text[]),
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL
);

CREATE TABLE audit_log (
    audit_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    key_name    text NOT NULL,
    action      text NOT NULL,
    target      text,
    outcome     text NOT NULL,
    detail      jsonb
);

CREATE INDEX audit_log_at_idx ON audit_log (at DESC, audit_id DESC);
CREATE INDEX audit_log_key_idx ON audit_log (key_name, audit_id DESC);
CREATE INDEX audit_log_action_idx ON audit_log (action, audit_id DESC);

CREATE TABLE workers (
    worker_id   text PRIMARY KEY,
    queues      text[] NOT NULL,
    slots       integer NOT NULL CHECK (slots >= 0),
    version     text NOT NULL,
    running     uuid[] NOT NULL DEFAULT '{}',
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX workers_last_seen_idx ON workers (last_seen DESC);
