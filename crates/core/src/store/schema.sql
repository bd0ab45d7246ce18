-- jobforge schema, version 1. `{S}` is the quoted schema name.
-- Tables and columns follow the seed's persistence model (the row shapes of
-- CONTRACT.md in snake_case); the columns marked "jobforge" are additions a
-- database created for the TypeScript system gains through ADD COLUMN IF
-- NOT EXISTS, so such a database is upgraded in place.

CREATE TABLE IF NOT EXISTS {S}.job (
  type                     text PRIMARY KEY,
  version                  integer NOT NULL DEFAULT 1,
  pool                     text NOT NULL DEFAULT 'batch',
  scope_entity_type        text,
  retry_policy             jsonb NOT NULL DEFAULT '{"attempts":1,"backoff":"fixed","baseMs":0}',
  timeout_ms               bigint,
  concurrency_key_template text,
  collision_mode           text NOT NULL DEFAULT 'queue'
                           CHECK (collision_mode IN ('queue', 'reject', 'replace')),
  dedupe_key_template      text,
  dedupe_window_ms         bigint,
  priority_default         integer NOT NULL DEFAULT 0,
  replay_from              text NOT NULL DEFAULT 'last_checkpoint'
                           CHECK (replay_from IN ('scratch', 'last_step', 'last_checkpoint')),
  created_at               timestamptz NOT NULL DEFAULT now(),
  updated_at               timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS {S}.job_run (
  id                  uuid PRIMARY KEY,
  job_type            text NOT NULL,
  job_version         integer NOT NULL DEFAULT 1,
  parent_run_id       uuid,
  root_run_id         uuid NOT NULL,
  parent_close_policy text NOT NULL DEFAULT 'terminate'
                      CHECK (parent_close_policy IN ('terminate', 'cancel', 'abandon')),
  scope_entity_type   text,
  scope_entity_id     text,
  tenant_id           text,
  tags                jsonb NOT NULL DEFAULT '{}',
  pool                text NOT NULL,
  priority            integer NOT NULL DEFAULT 0,
  concurrency_key     text,
  dedupe_key          text,
  status              text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'canceled')),
  input               jsonb NOT NULL DEFAULT '{}',
  output              jsonb,
  error               jsonb,
  trigger_source      text NOT NULL DEFAULT 'manual'
                      CHECK (trigger_source IN ('manual', 'schedule', 'event', 'parent')),
  trigger_ref         text,
  run_at              timestamptz NOT NULL DEFAULT now(),
  started_at          timestamptz,
  finished_at         timestamptz,
  claimed_at          timestamptz,
  attempts            integer NOT NULL DEFAULT 0,
  wait_kind           text CHECK (wait_kind IN ('sleep', 'signal', 'token', 'child')),
  resume_token        text,
  wait_deadline       timestamptz,
  created_at          timestamptz NOT NULL DEFAULT now(),
  updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS {S}.job_step (
  id          uuid PRIMARY KEY,
  job_run_id  uuid NOT NULL,
  step_id     text NOT NULL,
  kind        text NOT NULL DEFAULT 'task' CHECK (kind IN ('task', 'wait')),
  seq         integer NOT NULL,
  status      text NOT NULL
              CHECK (status IN ('pending', 'running', 'completed', 'failed', 'skipped')),
  input       jsonb,
  output      jsonb,
  error       jsonb,
  attempts    integer NOT NULL DEFAULT 0,
  started_at  timestamptz,
  finished_at timestamptz,
  UNIQUE (job_run_id, step_id)
);

-- jobforge: created order / lane order, claim epochs, the executing flag.
CREATE SEQUENCE IF NOT EXISTS {S}.job_run_seq;
ALTER TABLE {S}.job_run ADD COLUMN IF NOT EXISTS seq bigint NOT NULL DEFAULT nextval('{S}.job_run_seq');
ALTER TABLE {S}.job_run ADD COLUMN IF NOT EXISTS lane_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE {S}.job_run ADD COLUMN IF NOT EXISTS claim_epoch integer NOT NULL DEFAULT 0;
ALTER TABLE {S}.job_run ADD COLUMN IF NOT EXISTS executing boolean NOT NULL DEFAULT false;
ALTER TABLE {S}.job_step ADD COLUMN IF NOT EXISTS epoch integer NOT NULL DEFAULT 0;

-- Claims: the best pending run of a pool (priority, then runAt, then created).
CREATE INDEX IF NOT EXISTS job_run_claim_idx ON {S}.job_run (pool, priority DESC, run_at, seq)
  WHERE status = 'pending';
-- Lanes: the live runs of a concurrency key in lane order.
CREATE INDEX IF NOT EXISTS job_run_lane_idx ON {S}.job_run (concurrency_key, tenant_id, lane_seq)
  WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'running', 'waiting');
CREATE INDEX IF NOT EXISTS job_run_dedupe_idx ON {S}.job_run (job_type, dedupe_key, created_at)
  WHERE dedupe_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS job_run_parent_idx ON {S}.job_run (parent_run_id, seq)
  WHERE parent_run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS job_run_root_idx ON {S}.job_run (root_run_id);
CREATE INDEX IF NOT EXISTS job_run_scope_idx ON {S}.job_run (scope_entity_type, scope_entity_id, seq)
  WHERE scope_entity_type IS NOT NULL;
CREATE INDEX IF NOT EXISTS job_run_created_idx ON {S}.job_run (tenant_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS job_run_pool_status_idx ON {S}.job_run (tenant_id, pool, status);
CREATE INDEX IF NOT EXISTS job_run_failed_idx ON {S}.job_run (tenant_id, finished_at DESC, id DESC)
  WHERE status = 'failed';
-- The sweeper: running runs by lease age.
CREATE INDEX IF NOT EXISTS job_run_lease_idx ON {S}.job_run (claimed_at) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS job_run_finished_idx ON {S}.job_run (finished_at)
  WHERE finished_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS {S}.jobforge_migration (
  version    integer PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {S}.jobforge_migration (version) VALUES (1) ON CONFLICT DO NOTHING;

-- jobforge, version 2: schedules (recurring starts), one per (tenant, name).
-- Exactly one of cron / every_ms is set; next_fire_at is null once a cron
-- expression can never fire again.
CREATE TABLE IF NOT EXISTS {S}.job_schedule (
  name          text NOT NULL,
  tenant_id     text,
  job_type      text NOT NULL,
  input         jsonb NOT NULL DEFAULT '{}',
  cron          text,
  every_ms      bigint,
  anchor        timestamptz NOT NULL,
  next_fire_at  timestamptz,
  last_fired_at timestamptz,
  last_run_id   uuid,
  last_error    text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now(),
  CHECK ((cron IS NULL) <> (every_ms IS NULL))
);
-- The IANA zone a cron expression is read in (null: UTC).
ALTER TABLE {S}.job_schedule ADD COLUMN IF NOT EXISTS timezone text;
-- The key: a null tenant is its own value (UNIQUE NULLS NOT DISTINCT needs 15+).
CREATE UNIQUE INDEX IF NOT EXISTS job_schedule_key_idx
  ON {S}.job_schedule ((tenant_id IS NULL), coalesce(tenant_id, ''), name);
CREATE INDEX IF NOT EXISTS job_schedule_due_idx ON {S}.job_schedule (next_fire_at)
  WHERE next_fire_at IS NOT NULL;
INSERT INTO {S}.jobforge_migration (version) VALUES (2) ON CONFLICT DO NOTHING;

-- jobforge, version 3: durable waits. A waiting run says what it waits for
-- (wait_kind) and when it resumes at the latest (wait_deadline); a wait
-- step is a job_step of kind 'wait'. The checks of earlier versions allowed
-- less: they are replaced once, by the migration that records version 3
-- (running migrate again neither rewrites them nor scans the tables). The
-- test is this schema's own migration row, not the catalog: a catalog
-- query matching the constraints by name would read other schemas' too,
-- and fail on one being dropped meanwhile.
DO $jobforge$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM {S}.jobforge_migration WHERE version = 3) THEN
    ALTER TABLE {S}.job_run DROP CONSTRAINT IF EXISTS job_run_wait_kind_check;
    ALTER TABLE {S}.job_run ADD CONSTRAINT job_run_wait_kind_check
      CHECK (wait_kind IN ('sleep', 'signal', 'token', 'child'));
    ALTER TABLE {S}.job_step DROP CONSTRAINT IF EXISTS job_step_kind_check;
    ALTER TABLE {S}.job_step ADD CONSTRAINT job_step_kind_check CHECK (kind IN ('task', 'wait'));
  END IF;
END
$jobforge$;
-- The invoke waits a run's end resolves: [["<run id>", "<step id>"], ...]
-- (null when none, as for most runs).
ALTER TABLE {S}.job_run ADD COLUMN IF NOT EXISTS awaited_by jsonb;
-- The resumer: waiting runs by deadline (seq breaks ties, as in memory).
CREATE INDEX IF NOT EXISTS job_run_wait_deadline_idx ON {S}.job_run (wait_deadline, seq)
  WHERE status = 'waiting' AND wait_deadline IS NOT NULL;
-- A run's inbox: signals sent that no wait took yet, FIFO per (run, name).
-- The key is the inbox order itself, so one index serves taking the oldest
-- of a name, counting a run's signals and deleting them; a primary key
-- also gives deletes a replica identity (logical replication).
CREATE TABLE IF NOT EXISTS {S}.job_signal (
  id         bigint GENERATED ALWAYS AS IDENTITY,
  run_id     uuid NOT NULL,
  name       text NOT NULL,
  payload    jsonb NOT NULL DEFAULT 'null',
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, name, id)
);
INSERT INTO {S}.jobforge_migration (version) VALUES (3) ON CONFLICT DO NOTHING;

-- jobforge, version 4: the run timeline. One row per transition of a run
-- (its `created` event is the run row itself), written in the transaction
-- of the change and deleted with the run. The key is the timeline order,
-- so one index serves a run's pages and the purge's delete.
CREATE TABLE IF NOT EXISTS {S}.job_event (
  id      bigint GENERATED ALWAYS AS IDENTITY,
  run_id  uuid NOT NULL,
  at      timestamptz NOT NULL,
  kind    text NOT NULL,
  attempt integer NOT NULL DEFAULT 0,
  data    jsonb,
  PRIMARY KEY (run_id, id)
);
-- The metrics' gauge of waiting runs per pool reads no finished run: the
-- waiting runs with a deadline through job_run_wait_deadline_idx, those
-- without one through this (it cannot serve, nor mislead, the resumer's
-- deadline queries, which need a deadline).
CREATE INDEX IF NOT EXISTS job_run_waiting_idx ON {S}.job_run (pool)
  WHERE status = 'waiting' AND wait_deadline IS NULL;
INSERT INTO {S}.jobforge_migration (version) VALUES (4) ON CONFLICT DO NOTHING;

-- jobforge, version 5: a page of a scope's runs (listJobRuns with a scope)
-- walks the tenant's runs of the scope newest first, reading only as many
-- index rows as the page needs (job_run_scope_idx holds every tenant's runs
-- of a scope in start order: a page had to read and sort all of them).
-- Only scoped runs have an entry.
CREATE INDEX IF NOT EXISTS job_run_scope_page_idx ON {S}.job_run
  (tenant_id, scope_entity_type, scope_entity_id, created_at DESC, id DESC)
  WHERE scope_entity_type IS NOT NULL;
INSERT INTO {S}.jobforge_migration (version) VALUES (5) ON CONFLICT DO NOTHING;

-- jobforge, version 6: what a database created for the TypeScript system
-- (the seed) lacked, its tables being kept by CREATE TABLE IF NOT EXISTS:
-- the step key every step write names (ON CONFLICT (job_run_id, step_id);
-- without it every ctx.step failed), and 64-bit durations in definitions
-- (a timeout or dedupe window over 24.8 days did not fit its integer
-- columns, and the failed write held up every start behind it). A table
-- created by version 1 has the key already (as its UNIQUE constraint).
DO $jobforge$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM {S}.jobforge_migration WHERE version = 6) THEN
    IF to_regclass('{S}.job_step_job_run_id_step_id_key') IS NULL
       AND to_regclass('{S}.job_step_run_step_key') IS NULL THEN
      CREATE UNIQUE INDEX job_step_run_step_key ON {S}.job_step (job_run_id, step_id);
    END IF;
    ALTER TABLE {S}.job ALTER COLUMN timeout_ms TYPE bigint,
      ALTER COLUMN dedupe_window_ms TYPE bigint;
  END IF;
END
$jobforge$;
INSERT INTO {S}.jobforge_migration (version) VALUES (6) ON CONFLICT DO NOTHING;
