"""SQLite schema of the trace store. Bump SCHEMA_VERSION when a table changes.

``calls.prompt_ids`` holds int32 token ids. When a call's prompt extends the previous call's prompt +
completion (``extends_previous``), only the new suffix is stored and ``prompt_prefix_len`` says how many
leading tokens come from the previous call; storage then grows linearly with a rollout's turns, not
quadratically. Likewise, when a chat request's ``messages`` start with the previous call's messages,
only the new messages are stored and ``messages_prefix_len`` counts the ones taken from the previous call.
Readers rebuild full prompts and requests in sequence order (``codec.rebuild``).

"Previous" means the rollout's previous call *of the same purpose* (``calls.purpose``: ``policy``, or
``auxiliary`` / ``summary`` for a harness's side calls such as OpenCode's title request, which arrive
between the agent's own calls); ``prefix_seq`` names it.
"""

SCHEMA_VERSION = 6
# Rows are a few KB (request + token blobs): a rowid table on 16 KiB pages inserts them about twice as fast
# as WITHOUT ROWID on 4 KiB pages (measured; see docs/architecture.md).
PAGE_SIZE = 16384

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    created_at  REAL NOT NULL,
    config_json TEXT
);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id      TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL DEFAULT '',
    task_id         TEXT NOT NULL DEFAULT '',
    group_id        TEXT NOT NULL DEFAULT '',
    loop_kind       TEXT NOT NULL DEFAULT 'proxy',
    harness         TEXT NOT NULL DEFAULT '',
    harness_version TEXT NOT NULL DEFAULT '',
    mode            TEXT NOT NULL DEFAULT 'eval',
    status          TEXT NOT NULL DEFAULT 'pending',
    reward          REAL,
    failure_reason  TEXT,
    created_at      REAL NOT NULL,
    finished_at     REAL,
    metadata_json   TEXT
);
CREATE INDEX IF NOT EXISTS rollouts_by_run ON rollouts (run_id, task_id);
CREATE TABLE IF NOT EXISTS calls (
    rollout_id         TEXT NOT NULL,
    seq                INTEGER NOT NULL,
    endpoint           TEXT NOT NULL,
    status             TEXT NOT NULL,
    request_json       BLOB,
    response_json      BLOB,
    prompt_ids         BLOB,
    completion_ids     BLOB,
    logprobs           BLOB,
    finish_reason      TEXT,
    prompt_tokens      INTEGER,
    completion_tokens  INTEGER,
    http_status        INTEGER,
    error              TEXT,
    streamed           INTEGER NOT NULL DEFAULT 0,
    retry_count        INTEGER,
    client_headers     TEXT,
    sampling_overrides TEXT,
    t_start            REAL NOT NULL,
    t_first_byte       REAL,
    t_end              REAL,
    extends_previous   INTEGER,
    prompt_prefix_len  INTEGER NOT NULL DEFAULT 0,
    messages_prefix_len INTEGER NOT NULL DEFAULT 0,
    purpose            TEXT NOT NULL DEFAULT 'policy',
    prefix_seq         INTEGER,
    policy_version     INTEGER,
    PRIMARY KEY (rollout_id, seq)
);
"""

CALL_COLUMNS = (
    "rollout_id", "seq", "endpoint", "status", "request_json", "response_json", "prompt_ids",
    "completion_ids", "logprobs", "finish_reason", "prompt_tokens", "completion_tokens", "http_status",
    "error", "streamed", "retry_count", "client_headers", "sampling_overrides", "t_start", "t_first_byte",
    "t_end", "extends_previous", "prompt_prefix_len", "messages_prefix_len", "purpose", "prefix_seq", "policy_version",
)

# Columns added after version 4, with their DDL, for stores written by an older version (policy_version: 6).
ADDED_CALL_COLUMNS = {
    "purpose": "TEXT NOT NULL DEFAULT 'policy'",
    "prefix_seq": "INTEGER",
    "policy_version": "INTEGER",
}

ROLLOUT_COLUMNS = (
    "rollout_id", "run_id", "task_id", "group_id", "loop_kind", "harness", "harness_version", "mode",
    "status", "reward", "failure_reason", "created_at", "finished_at", "metadata_json",
)
