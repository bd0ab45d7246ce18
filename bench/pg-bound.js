#!/usr/bin/env node
// The irreducible Postgres work of a jobforge drain, alone: per batch of B runs, one
// transaction that settles the previous batch (lock its rows, mark them completed) and
// claims the next (the worker's claim statement, then mark them running), on jobforge's
// own schema and indexes. No JS handlers, no engine. node bench/pg-bound.js [batch] [connections]   (INDEXES=drain-only|rebuilt|diet|diet-rebuilt: see below)
'use strict';

const path = require('path');
const { JobOrchestrator } = require(path.join(__dirname, '..', 'dist'));
const { Client } = require('pg');
const url = process.env.JOBFORGE_PG_URL || 'postgres://postgres@127.0.0.1:5432/test';
const N = 20000, B = Number(process.argv[2] || 200), CONNS = Number(process.argv[3] || 1);
const S = 'jf_bound';
(async () => {
  const admin = new Client({ connectionString: url }); await admin.connect();
  await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
  const o = new JobOrchestrator({ backend: 'postgres', postgres: { url, schema: S }, loggerFactory: () => ({ log() {}, warn() {}, debug() {}, error() {} }) });
  await o.migrate();
  o.registerHandler('noop', { pool: 'batch' }, async () => {});
  let next = 0;
  await Promise.all(Array.from({ length: 20 }, async () => { while (next < N) { next++; await o.start('noop', {}); } }));
  await o.close();
  // Diagnostics of what the indexes cost (INDEXES=…, default `all`, as migrated
  // and grown by the backlog's inserts): `drain-only` (DROP_IDX=1) keeps only the
  // indexes the drain reads (pkey, claim, lane, lease); `rebuilt` rebuilds every
  // index first (REINDEX: packed pages, as a freshly built index has); `diet`
  // makes the root index cover child runs only and the pool/status index live
  // runs only (two fewer entries per run: a hypothetical schema, not jobforge's);
  // `diet-rebuilt` both.
  const INDEXES = process.env.INDEXES || (process.env.DROP_IDX ? 'drain-only' : 'all');
  if (INDEXES === 'drain-only') {
    const keep = new Set(['job_run_pkey', 'job_run_claim_idx', 'job_run_lane_idx', 'job_run_lease_idx']);
    for (const r of (await admin.query(`SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'job_run'`, [S])).rows) {
      if (!keep.has(r.indexname)) await admin.query(`DROP INDEX ${S}.${r.indexname}`).catch(() => {});
    }
  } else if (INDEXES.startsWith('diet')) {
    await admin.query(`DROP INDEX ${S}.job_run_root_idx`);
    await admin.query(`CREATE INDEX job_run_root_idx ON ${S}.job_run (root_run_id) WHERE parent_run_id IS NOT NULL`);
    await admin.query(`DROP INDEX ${S}.job_run_pool_status_idx`);
    await admin.query(`CREATE INDEX job_run_pool_status_idx ON ${S}.job_run (tenant_id, pool, status) WHERE status IN ('pending', 'running', 'waiting')`);
  } else if (INDEXES !== 'all' && INDEXES !== 'rebuilt') {
    throw new Error(`INDEXES must be all, drain-only, rebuilt, diet or diet-rebuilt, got ${INDEXES}`);
  }
  if (INDEXES.endsWith('rebuilt')) await admin.query(`REINDEX TABLE ${S}.job_run`);
  await admin.query('CHECKPOINT');
  const claim = `SELECT id, claim_epoch FROM ${S}.job_run r WHERE pool = $1 AND status = 'pending' AND run_at <= $2 AND (concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM ${S}.job_run l WHERE l.concurrency_key = r.concurrency_key AND l.tenant_id IS NOT DISTINCT FROM r.tenant_id AND l.status IN ('pending','running','waiting') AND l.id <> r.id AND (l.lane_seq < r.lane_seq OR l.status = 'running'))) ORDER BY priority DESC, run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED`;
  const markRunning = `UPDATE ${S}.job_run r SET status='running', claimed_at=$2, started_at=$2, updated_at=$2, claim_epoch=r.claim_epoch+1, executing=true FROM unnest($1::uuid[]) AS u(id) WHERE r.id = u.id`;
  const lockEnds = `SELECT id FROM ${S}.job_run WHERE id = ANY($1) ORDER BY id FOR UPDATE`;
  const markDone = `UPDATE ${S}.job_run r SET status='completed', output='{}'::jsonb, finished_at=$2, updated_at=$2, attempts=r.attempts+1, executing=false FROM unnest($1::uuid[]) AS u(id) WHERE r.id = u.id`;
  let done = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CONNS }, async () => {
    const c = new Client({ connectionString: url }); await c.connect();
    let prev = [];
    for (;;) {
      const now = new Date();
      await c.query('BEGIN');
      if (prev.length) { await c.query(lockEnds, [prev]); await c.query(markDone, [prev, now]); done += prev.length; }
      const ids = (await c.query(claim, ['batch', now, B])).rows.map((r) => r.id);
      if (ids.length) await c.query(markRunning, [ids, now]);
      await c.query('COMMIT');
      prev = ids;
      if (!ids.length) break;
    }
    await c.end();
  }));
  const s = (performance.now() - t0) / 1000;
  console.log(JSON.stringify({ indexes: INDEXES, runs: done, batch: B, connections: CONNS, seconds: s.toFixed(2), runsPerS: Math.round(done / s) }));
  await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`); await admin.end();
})().catch((e) => { console.error(e); process.exit(1); });
