#!/usr/bin/env node
/*
 * PostgreSQL benchmark: jobforge's Postgres backend against graphile-worker,
 * on the same database, no-op jobs.
 *
 * 1. Enqueue: 2000 single-job enqueue calls (graphile-worker `addJob`,
 *    jobforge `start`), 20 in flight, into an empty schema with no worker;
 *    jobforge twice, with its grouped starts (the default) and without
 *    (`postgres.groupStarts: false`, one transaction per start). Then
 *    bulk: 20,000 jobs in calls of 1,000, one call at a time
 *    (graphile-worker `addJobs`, jobforge `startMany`), into an empty schema.
 * 2. Throughput, with 1, 2 and 4 worker processes (this script forked in its
 *    worker role, each running one worker with concurrency 20 and a pool of
 *    10 connections). Method: the schema is dropped and migrated, the parent
 *    enqueues a backlog of N jobs while no worker runs (not timed;
 *    graphile-worker through `addJobs`, jobforge through `start` with 20 in
 *    flight: single-job enqueues cost graphile-worker 2-4 ms each here, and
 *    three 20k backlogs that way would take minutes), then forks the workers,
 *    waits until every one has loaded its library and built its client, and
 *    tells them all to start. The clock runs from the first handler start in
 *    any worker to the last handler return in any worker; each worker
 *    reports its count, first and last timestamps and the indices it ran
 *    over IPC, and every index 0..N-1 must have run exactly once.
 * 3. Enqueue-to-start latency: one worker process started and idle, jobs
 *    enqueued at a steady rate (200/s for 5 s after 0.5 s of warm-up that
 *    is not counted). Each job's input carries its enqueue time
 *    (performance.timeOrigin + performance.now(), taken just before the
 *    enqueue call, so the insert's round trip is included); the handler
 *    records its start time minus that.
 *
 * Each system has its own schema (graphile-worker `gw_bench`, jobforge
 * `jf_bench`), dropped and migrated again before every scenario and dropped
 * at the end; a CHECKPOINT before each scenario starts them from the same
 * buffer state. graphile-worker runs with its defaults except the schema,
 * concurrency and pool size given here (LISTEN/NOTIFY on, pollInterval
 * 2000 ms, no local queue, no batched completion). The jobforge half runs
 * once `new JobOrchestrator({ backend: 'postgres', ... })` works and has
 * `migrate()`; until then it is skipped with the reason.
 *
 *   node bench/pg.js [--n 20000] [--reps 1] [--procs 1,2,4] [--concurrency 24] [--pool 10]
 *                    [--inflight 20] [--enqueue-n 2000] [--bulk-n 20000] [--rate 200] [--seconds 5]
 *                    [--limit 60 (seconds per throughput point)] [--prefetch N (jobforge's postgres.prefetch; default: unset)]
 *                    [--only graphile,graphileBatched,bullmq,jobforge] [--json <file>] [--docs]
 *   JOBFORGE_PG_URL   database URL (default postgres://postgres@127.0.0.1:5432/test)
 */
'use strict';

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { fork } = require('node:child_process');
const { performance } = require('node:perf_hooks');

const ROOT = path.join(__dirname, '..');
const DEFAULT_URL = 'postgres://postgres@127.0.0.1:5432/test';
const JOB = 'noop';

/** Wall-clock milliseconds with sub-millisecond resolution, comparable across processes. */
const nowMs = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const fmt = (x) => Math.round(x).toLocaleString('en-US');
const fmtMs = (x) => (x === null || x === undefined ? '–' : `${x < 10 ? x.toFixed(2) : x.toFixed(1)} ms`);
const redact = (url) => url.replace(/(\/\/[^:/@]+):[^@]*@/, '$1:***@');

// ── arguments ──────────────────────────────────────────────────────────

function parseArgs(argv) {
  const a = { n: 20000, reps: 1, procs: [1, 2, 4], concurrency: 24, pool: 10, inflight: 20, enqueueN: 2000, bulkN: 20000, rate: 200, seconds: 5, limitS: 60, prefetch: null, only: null, json: null, docs: false, worker: null };
  const int = (k, v) => {
    const x = Number(v);
    if (!Number.isInteger(x) || x < 1) throw new Error(`${k} needs a positive integer, got ${v}`);
    return x;
  };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const val = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${k} needs a value`);
      return v;
    };
    if (k === '--n') a.n = int(k, val());
    else if (k === '--reps') a.reps = int(k, val());
    else if (k === '--procs') a.procs = val().split(',').map((v) => int(k, v));
    else if (k === '--concurrency') a.concurrency = int(k, val());
    else if (k === '--pool') a.pool = int(k, val());
    else if (k === '--inflight') a.inflight = int(k, val());
    else if (k === '--enqueue-n') a.enqueueN = int(k, val());
    else if (k === '--bulk-n') a.bulkN = int(k, val());
    else if (k === '--rate') a.rate = int(k, val());
    else if (k === '--seconds') a.seconds = int(k, val());
    else if (k === '--limit') a.limitS = int(k, val());
    else if (k === '--prefetch') a.prefetch = int(k, val());
    else if (k === '--only') a.only = val();
    else if (k === '--json') a.json = path.resolve(val());
    else if (k === '--docs') a.docs = true;
    else if (k === '--worker') a.worker = JSON.parse(val()); // internal: worker role
    else throw new Error(`unknown option ${k}`);
  }
  if (a.pool < 2) throw new Error('--pool must be at least 2 (graphile-worker needs 2)');
  if (a.only) {
    a.only = a.only.split(',');
    for (const o of a.only) if (!SYSTEMS[o]) throw new Error(`--only takes a comma-separated list of ${Object.keys(SYSTEMS).join(', ')}`);
  }
  return a;
}

// ── the two systems ────────────────────────────────────────────────────
//
// Each system gives the parent `probe` (available? which version and
// configuration?) and `client` (migrate, enqueue, an optional bulk enqueue,
// a count of jobs not completed, close), and the worker role `worker`
// (built before the clock, `start` on "go", `stop`). `onJob(input)` is the
// shared no-op body: it only records side effects for the parent.

const quietGraphileLogger = () => {
  const { Logger } = require('graphile-worker');
  return new Logger(() => (level, message) => {
    if (level === 'error') console.error(`[graphile-worker] ${message}`);
  });
};

const quietJobforgeLogger = {
  log() {},
  warn() {},
  debug() {},
  error: (...a) => console.error('[jobforge]', ...a),
};

/**
 * graphile-worker's batched mode, as its performance guide documents it
 * (worker.graphile.org/docs/performance#batching; the option names of
 * 0.17's `GraphileConfig.WorkerOptions`): a local queue of jobs fetched and
 * locked ahead of free slots, and completions/failures written in batches.
 */
const GRAPHILE_BATCHED = { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 };

/** graphile-worker, plain (its defaults) or batched (`preset.worker` = GRAPHILE_BATCHED). */
function graphileSystem(label, schema, batched) {
  const sys = {
    label,
    schema,
    probe() {
      const gw = require('graphile-worker');
      const version = require('graphile-worker/package.json').version;
      if (typeof gw.run !== 'function' || typeof gw.makeWorkerUtils !== 'function') throw new Error('graphile-worker has no run/makeWorkerUtils');
      return {
        version,
        config: batched
          ? `graphile-worker ${version} batched: run({ concurrency, maxPoolSize, schema: '${schema}', taskList, preset: { worker: ${JSON.stringify(GRAPHILE_BATCHED).replace(/"/g, '')} } }), the rest default`
          : `graphile-worker ${version}: run({ concurrency, maxPoolSize, schema: '${schema}', taskList }), everything else default (LISTEN/NOTIFY on, pollInterval 2000 ms, localQueue off, completeJobBatchDelay off, prepared statements on)`,
      };
    },
    async client(cfg) {
      const gw = require('graphile-worker');
      const utils = await gw.makeWorkerUtils({ connectionString: cfg.url, schema, maxPoolSize: cfg.pool, logger: quietGraphileLogger() });
      return {
        migrate: () => utils.migrate(),
        enqueue: (input) => utils.addJob(JOB, input),
        /** The backlog through addJobs (one statement per 1000 jobs). */
        enqueueBulk: async (inputs) => {
          for (let k = 0; k < inputs.length; k += 1000) await utils.addJobs(inputs.slice(k, k + 1000).map((payload) => ({ identifier: JOB, payload })));
        },
        /** One bulk call (the enqueue scenario's bulk half). */
        enqueueBatch: (inputs) => utils.addJobs(inputs.map((payload) => ({ identifier: JOB, payload }))),
        /** Jobs still in the table (graphile-worker deletes a job when it completes). */
        pendingAfter: async (pg) => Number((await pg.query(`select count(*)::int as c from ${schema}._private_jobs`)).rows[0].c),
        close: () => utils.release(),
      };
    },
    worker(cfg, onJob) {
      const gw = require('graphile-worker');
      let runner = null;
      return {
        async start() {
          runner = await gw.run({
            connectionString: cfg.url,
            schema,
            concurrency: cfg.concurrency,
            maxPoolSize: cfg.pool,
            noHandleSignals: true,
            logger: quietGraphileLogger(),
            taskList: { [JOB]: async (payload) => onJob(payload) },
            ...(batched ? { preset: { worker: GRAPHILE_BATCHED } } : {}),
          });
        },
        async stop() {
          if (runner) await runner.stop();
        },
      };
    },
  };
  return sys;
}

const BULL_QUEUE = 'jf_bench_bull';
const REDIS = { host: '127.0.0.1', port: 6379 };

const SYSTEMS = {
  graphile: graphileSystem('graphile-worker', 'gw_bench', false),
  graphileBatched: graphileSystem('graphile batched', 'gwb_bench', true),

  /** BullMQ 5 on the local Redis: skipped (with the reason) when bullmq is missing or Redis does not answer. */
  bullmq: {
    label: 'BullMQ',
    schema: null,
    async probe() {
      let version;
      try {
        require('bullmq');
        version = require('bullmq/package.json').version;
      } catch (e) {
        throw new Error(`the bullmq package is missing (npm install): ${e.message.split('\n')[0]}`);
      }
      const IORedis = require('ioredis');
      const r = new IORedis({ ...REDIS, lazyConnect: true, connectTimeout: 2000, maxRetriesPerRequest: 0, retryStrategy: () => null });
      r.on('error', () => {});
      let redis;
      try {
        await r.connect();
        redis = (await r.info('server')).match(/redis_version:(\S+)/)?.[1] ?? '?';
      } catch (e) {
        throw new Error(`Redis does not answer at ${REDIS.host}:${REDIS.port} (${e.message})`);
      } finally {
        r.disconnect();
      }
      return {
        version,
        config: `BullMQ ${version} on Redis ${redis} at ${REDIS.host}:${REDIS.port}: new Worker(queue, processor, { concurrency }) per process, defaults otherwise (completed jobs kept); backlog by addBulk, 1000 per call`,
      };
    },
    async client() {
      const { Queue } = require('bullmq');
      const q = new Queue(BULL_QUEUE, { connection: REDIS });
      return {
        migrate: async () => {
          await q.obliterate({ force: true });
        },
        enqueue: (input) => q.add(JOB, input),
        enqueueBulk: async (inputs) => {
          for (let k = 0; k < inputs.length; k += 1000) await q.addBulk(inputs.slice(k, k + 1000).map((data) => ({ name: JOB, data })));
        },
        /** One bulk call (the enqueue scenario's bulk half). */
        enqueueBatch: (inputs) => q.addBulk(inputs.map((data) => ({ name: JOB, data }))),
        pendingAfter: async () => {
          const c = await q.getJobCounts('wait', 'active', 'delayed', 'prioritized', 'paused', 'waiting-children');
          return Object.values(c).reduce((s, x) => s + x, 0);
        },
        close: () => q.close(),
        drop: () => q.obliterate({ force: true }),
      };
    },
    worker(cfg, onJob) {
      const { Worker } = require('bullmq');
      const w = new Worker(BULL_QUEUE, async (job) => onJob(job.data), { connection: REDIS, concurrency: cfg.concurrency, autorun: false });
      w.on('error', (e) => console.error('[bullmq]', e.message));
      return {
        async start() {
          void w.run();
          await w.waitUntilReady();
        },
        async stop() {
          await w.close();
        },
      };
    },
  },

  jobforge: {
    label: 'jobforge',
    schema: 'jf_bench',
    create(cfg) {
      const { JobOrchestrator } = require(path.join(ROOT, 'dist'));
      return new JobOrchestrator({
        backend: 'postgres',
        postgres: { url: cfg.url, schema: SYSTEMS.jobforge.schema, maxConnections: cfg.pool, groupStarts: cfg.groupStarts, prefetch: cfg.prefetch ?? undefined },
        loggerFactory: () => quietJobforgeLogger,
      });
    },
    async probe(cfg) {
      try {
        require(path.join(ROOT, 'dist'));
      } catch (e) {
        throw new Error(`cannot load dist/ (build it with npm run build): ${e.message.split('\n')[0]}`);
      }
      let o;
      try {
        o = this.create(cfg);
      } catch (e) {
        throw new Error(`new JobOrchestrator({ backend: 'postgres' }) throws: ${e.message.split('\n')[0]}`);
      }
      const ok = typeof o.migrate === 'function';
      if (typeof o.close === 'function') await o.close();
      if (!ok) throw new Error("the Postgres backend is not there yet (JobOrchestrator has no migrate())");
      let version = null;
      try {
        version = require(path.join(ROOT, 'package.json')).version;
      } catch {}
      return {
        version,
        config: `jobforge ${version ?? '?'}: backend 'postgres', schema 'jf_bench', maxConnections = pool, prefetch ${cfg.prefetch ?? 'default (paced: concurrency to 200)'}, startWorker({ pools: { batch: { concurrency } } })`,
      };
    },
    async client(cfg) {
      const o = this.create(cfg);
      return {
        // start() needs the type registered; registering writes the job's
        // definition to the database, so only once the tables exist. No
        // worker runs in this process.
        migrate: async () => {
          await o.migrate();
          o.registerHandler(JOB, { pool: 'batch' }, async () => {});
        },
        enqueue: (input) => o.start(JOB, input),
        /** One bulk call (the enqueue scenario's bulk half). */
        enqueueBatch: (inputs) => o.startMany(inputs.map((input) => ({ type: JOB, input }))),
        /** Runs of the benchmark not completed, if the orchestrator can count them. */
        pendingAfter: async () => {
          if (typeof o.countByPoolAndStatus !== 'function') return null;
          const counts = await o.countByPoolAndStatus();
          return counts.filter((c) => c.status !== 'completed').reduce((s, c) => s + c.count, 0);
        },
        close: async () => {
          if (typeof o.close === 'function') await o.close();
        },
      };
    },
    worker(cfg, onJob) {
      const o = SYSTEMS.jobforge.create(cfg);
      o.registerHandler(JOB, { pool: 'batch' }, async (ctx) => onJob(ctx.input));
      let w = null;
      return {
        async start() {
          w = await o.startWorker({ pools: { batch: { concurrency: cfg.concurrency } } });
        },
        async stop() {
          if (w) await w.stop();
          if (typeof o.close === 'function') await o.close();
        },
      };
    },
  },
};

// ── worker role (child process) ────────────────────────────────────────

async function workerMain(cfg) {
  const st = { count: 0, first: null, last: null, idx: [], lat: [] };
  const onJob = (input) => {
    const t = nowMs();
    if (st.first === null) st.first = t;
    st.count++;
    st.idx.push(input.i);
    if (typeof input.t === 'number') st.lat.push([input.i, t - input.t]);
    st.last = nowMs();
  };
  const sys = SYSTEMS[cfg.system];
  const w = sys.worker.call(sys, cfg, onJob);
  let timer = null;
  const progress = () => process.send({ type: 'progress', count: st.count });
  process.on('message', (m) => {
    (async () => {
      if (m.type === 'go') {
        await w.start();
        timer = setInterval(progress, 50);
        process.send({ type: 'started' });
      } else if (m.type === 'stop') {
        clearInterval(timer);
        await w.stop();
        process.send({ type: 'done', ...st }, () => process.exit(0));
      }
    })().catch(fail);
  });
  process.on('disconnect', () => process.exit(0)); // the parent is gone: do not linger
  process.send({ type: 'ready' });
}

function fail(e) {
  const message = e && e.stack ? e.stack : String(e);
  if (process.send) process.send({ type: 'error', message }, () => process.exit(1));
  else {
    console.error(message);
    process.exit(1);
  }
}

// ── parent: a fleet of worker processes ────────────────────────────────

class Fleet {
  constructor(system, procs, cfg) {
    this.children = [];
    this.counts = new Array(procs).fill(0);
    this.done = new Array(procs).fill(null);
    this.error = null;
    this.waiters = [];
    for (let k = 0; k < procs; k++) {
      const child = fork(__filename, ['--worker', JSON.stringify({ ...cfg, system, proc: k })], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      const c = { child, ready: false, started: false, exited: false };
      child.on('message', (m) => {
        if (m.type === 'ready') c.ready = true;
        else if (m.type === 'started') c.started = true;
        else if (m.type === 'progress') this.counts[k] = m.count;
        else if (m.type === 'done') {
          this.counts[k] = m.count;
          this.done[k] = m;
        } else if (m.type === 'error') this.error ??= `worker ${k}: ${m.message}`;
        this.wake();
      });
      child.on('exit', (code) => {
        c.exited = true;
        if (code !== 0 && !this.done[k]) this.error ??= `worker ${k} exited with code ${code}`;
        this.wake();
      });
      this.children.push(c);
    }
  }

  wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Resolves when pred() holds; rejects on a worker error or after limitMs. */
  async until(pred, limitMs, what) {
    const deadline = Date.now() + limitMs;
    for (;;) {
      if (this.error) throw new Error(this.error);
      if (pred()) return true;
      const left = deadline - Date.now();
      if (left <= 0) {
        if (what) throw new Error(`timed out after ${limitMs / 1000} s waiting for ${what}`);
        return false;
      }
      await new Promise((r) => {
        this.waiters.push(r);
        setTimeout(r, Math.min(left, 100));
      });
    }
  }

  total() {
    return this.counts.reduce((s, c) => s + c, 0);
  }

  async ready() {
    await this.until(() => this.children.every((c) => c.ready), 60_000, 'the workers to load');
  }

  async go() {
    for (const c of this.children) c.child.send({ type: 'go' });
    await this.until(() => this.children.every((c) => c.started), 60_000, 'the workers to start');
  }

  /** Stops every worker and returns their final reports. */
  async stop() {
    for (const c of this.children) if (!c.exited) c.child.send({ type: 'stop' });
    try {
      await this.until(() => this.done.every(Boolean), 60_000, 'the workers to stop');
    } finally {
      this.kill();
    }
    return this.done;
  }

  kill() {
    for (const c of this.children) if (!c.exited) c.child.kill('SIGKILL');
  }
}

// ── parent: scenarios ──────────────────────────────────────────────────

async function resetSchema(pg, sys, client) {
  if (sys.schema) await pg.query(`DROP SCHEMA IF EXISTS ${sys.schema} CASCADE`);
  try {
    await pg.query('CHECKPOINT'); // every scenario starts with the same buffer state
  } catch {}
  await client.migrate();
}

/** Enqueues `count` jobs with at most `inflight` single-job calls outstanding; returns jobs/s. */
async function enqueueSingles(client, count, inflight, input) {
  let next = 0;
  const t0 = nowMs();
  const lane = async () => {
    while (next < count) {
      const i = next++;
      await client.enqueue(input(i));
    }
  };
  await Promise.all(Array.from({ length: Math.min(inflight, count) }, lane));
  return count / ((nowMs() - t0) / 1000);
}

/** Enqueues `count` jobs in bulk calls of `batch`, one call at a time; returns jobs/s. */
async function enqueueBatches(client, count, batch, input) {
  const t0 = nowMs();
  for (let k = 0; k < count; k += batch) {
    await client.enqueueBatch(Array.from({ length: Math.min(batch, count - k) }, (_, j) => input(k + j)));
  }
  return count / ((nowMs() - t0) / 1000);
}

/** The throughput backlog: the system's bulk path if it has one, else single calls. */
async function enqueueBacklog(client, n, inflight) {
  const t0 = nowMs();
  let how;
  if (client.enqueueBulk) {
    await client.enqueueBulk(Array.from({ length: n }, (_, i) => ({ i })));
    how = 'bulk';
  } else {
    await enqueueSingles(client, n, inflight, (i) => ({ i }));
    how = `single calls, ${inflight} in flight`;
  }
  return { how, seconds: (nowMs() - t0) / 1000 };
}

/** Polls until the system reports no unsettled job; the time it first did, or null after limitMs. */
async function waitSettled(checker, pg, limitMs) {
  const deadline = nowMs() + limitMs;
  while (nowMs() < deadline) {
    const left = await checker.pendingAfter(pg);
    if (left === null) return null; // this system cannot tell
    if (left === 0) return nowMs();
    await sleep(5);
  }
  return null;
}

function checkIndices(reports, n) {
  const seen = new Uint8Array(n);
  let dup = 0;
  let bad = 0;
  for (const r of reports) {
    for (const i of r.idx) {
      if (!(i >= 0 && i < n)) bad++;
      else if (seen[i]++) dup++;
    }
  }
  const missing = n - seen.reduce((s, v) => s + (v ? 1 : 0), 0);
  return { missing, duplicates: dup, outOfRange: bad };
}

/** Opens the system's client, runs f(client), closes it. */
async function withClient(sys, cfg, f) {
  const client = await sys.client(cfg);
  try {
    return await f(client);
  } finally {
    await client.close();
  }
}

/**
 * Enqueue into an empty schema, no worker running: single-job calls,
 * `inflight` outstanding (jobforge also with `groupStarts: false`, on a
 * client of its own, the two in alternating order by repetition), then
 * `bulkN` jobs in bulk calls of 1,000, one at a time. Each measure after
 * a schema reset and a warm-up (200 single calls; one bulk call) that is
 * not counted.
 */
async function enqueuePoint(pg, name, opt, rep = 0) {
  const sys = SYSTEMS[name];
  const singles = (groupStarts) =>
    withClient(sys, { url: opt.url, concurrency: opt.concurrency, pool: opt.pool, groupStarts }, async (client) => {
      await resetSchema(pg, sys, client);
      await enqueueSingles(client, Math.min(200, opt.enqueueN), opt.inflight, (i) => ({ i, warm: true })); // warm-up
      return enqueueSingles(client, opt.enqueueN, opt.inflight, (i) => ({ i }));
    });
  const out = { jobs: opt.enqueueN, inflight: opt.inflight };
  if (name === 'jobforge') {
    // The same run measures both: grouped (the default) and one transaction per start.
    for (const grouped of rep % 2 === 0 ? [true, false] : [false, true]) {
      if (grouped) out.jobsPerS = await singles(undefined);
      else out.ungroupedJobsPerS = await singles(false);
    }
  } else {
    out.jobsPerS = await singles(undefined);
  }
  out.bulkJobs = opt.bulkN;
  out.bulkBatch = 1000;
  out.bulkJobsPerS = await withClient(sys, { url: opt.url, concurrency: opt.concurrency, pool: opt.pool }, async (client) => {
    await resetSchema(pg, sys, client);
    await enqueueBatches(client, 1000, 1000, (i) => ({ i, warm: true })); // warm-up
    return enqueueBatches(client, opt.bulkN, 1000, (i) => ({ i }));
  });
  return out;
}

async function throughputPoint(pg, name, procs, opt) {
  const sys = SYSTEMS[name];
  const cfg = { url: opt.url, concurrency: opt.concurrency, pool: opt.pool, prefetch: opt.prefetch };
  // The parent's connections are closed while the workers run, so
  // procs x pool connections fit in the server's max_connections.
  const backlog = await withClient(sys, cfg, async (client) => {
    await resetSchema(pg, sys, client);
    return enqueueBacklog(client, opt.n, opt.inflight);
  });
  // A 2-connection client watches the table: from the moment 98% of the
  // handlers have reported (progress arrives up to 50 ms late), it polls
  // until no job is left unsettled (graphile-worker deletes a job when it
  // completes; jobforge may settle in batches). A job settles only after
  // its handler returned, so that moment is when everything was done.
  const checker = await sys.client({ ...cfg, pool: 2 });
  const fleet = new Fleet(name, procs, cfg);
  let reports;
  let finished;
  let settledAt = null;
  let pendingAfter = null;
  try {
    await checker.pendingAfter(pg); // connect now, not on the clock
    await fleet.ready();
    await fleet.go();
    const deadline = nowMs() + opt.limitS * 1000;
    finished = await fleet.until(() => fleet.total() >= Math.floor(opt.n * 0.98), deadline - nowMs(), null);
    if (finished) settledAt = await waitSettled(checker, pg, Math.max(0, deadline - nowMs()) + 10_000);
    finished = finished && (await fleet.until(() => fleet.total() >= opt.n, Math.max(0, deadline - nowMs()) + 10_000, null));
    reports = await fleet.stop();
    pendingAfter = await checker.pendingAfter(pg).catch(() => null);
  } finally {
    fleet.kill();
    await checker.close();
  }
  const firsts = reports.map((r) => r.first).filter((x) => x !== null);
  const lasts = reports.map((r) => r.last).filter((x) => x !== null);
  const ran = reports.reduce((s, r) => s + r.count, 0);
  const t0 = Math.min(...firsts);
  const t1 = Math.max(...lasts);
  const seconds = (t1 - t0) / 1000;
  return {
    procs,
    n: opt.n,
    ran,
    timedOut: !finished,
    seconds,
    jobsPerS: ran / seconds,
    settleLagMs: settledAt === null ? null : Math.max(0, settledAt - t1),
    settledJobsPerS: settledAt === null ? null : ran / ((settledAt - t0) / 1000),
    backlog,
    startSkewMs: Math.max(...firsts) - Math.min(...firsts),
    perProc: reports.map((r) => r.count),
    ...checkIndices(reports, opt.n),
    pendingAfter,
  };
}

function pct(sorted, p) {
  if (!sorted.length) return null;
  const k = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[k];
}

async function latencyPoint(pg, name, opt) {
  const sys = SYSTEMS[name];
  const cfg = { url: opt.url, concurrency: opt.concurrency, pool: opt.pool, prefetch: opt.prefetch };
  const client = await sys.client(cfg);
  let fleet = null;
  try {
    await resetSchema(pg, sys, client);
    fleet = new Fleet(name, 1, cfg);
    await fleet.ready();
    await fleet.go();
    await sleep(500); // let the worker reach its idle wait (LISTEN / poll loop)
    const warm = Math.ceil(opt.rate / 2);
    const total = warm + opt.rate * opt.seconds;
    const interval = 1000 / opt.rate;
    const calls = [];
    const pending = [];
    const t0 = nowMs();
    for (let i = 0; i < total; i++) {
      const wait = t0 + i * interval - nowMs();
      if (wait >= 1) await sleep(wait);
      const t = nowMs();
      pending.push(
        client.enqueue({ i, t }).then(() => {
          if (i >= warm) calls.push(nowMs() - t);
        }),
      );
    }
    await Promise.all(pending);
    const sendS = (nowMs() - t0) / 1000;
    const finished = await fleet.until(() => fleet.total() >= total, opt.limitS * 1000, null);
    const [report] = await fleet.stop();
    fleet = null;
    const lat = report.lat
      .filter(([i]) => i >= warm)
      .map(([, ms]) => ms)
      .sort((a, b) => a - b);
    calls.sort((a, b) => a - b);
    return {
      rate: opt.rate,
      jobs: total - warm,
      warmup: warm,
      timedOut: !finished,
      achievedRate: total / sendS,
      measured: lat.length,
      p50: pct(lat, 50),
      p90: pct(lat, 90),
      p99: pct(lat, 99),
      max: lat.length ? lat[lat.length - 1] : null,
      mean: lat.length ? lat.reduce((s, x) => s + x, 0) / lat.length : null,
      enqueueCallP50: pct(calls, 50),
      enqueueCallP99: pct(calls, 99),
    };
  } finally {
    if (fleet) fleet.kill();
    await client.close();
  }
}

// ── parent: main ───────────────────────────────────────────────────────

/**
 * One point over repetitions: the median of every numeric field, the
 * rest (flags, per-process counts, …) from the first repetition, every
 * repetition's figures kept under `reps`. null when no repetition ran.
 */
function summarize(list) {
  if (!list.length) return null;
  const out = { ...list[0], repetitions: list.length };
  for (const [k, v] of Object.entries(list[0])) {
    if (typeof v !== 'number') continue;
    const xs = list.map((r) => r[k]).filter(Number.isFinite).sort((a, b) => a - b);
    const m = xs.length >> 1;
    out[k] = xs.length % 2 ? xs[m] : (xs[m - 1] + xs[m]) / 2;
  }
  for (const k of ['timedOut']) if (k in out) out[k] = list.some((r) => r[k]);
  for (const k of ['missing', 'duplicates', 'outOfRange', 'pendingAfter']) if (k in out) out[k] = Math.max(...list.map((r) => r[k] ?? 0));
  return out;
}


function pad(s, w) {
  return String(s).padEnd(w);
}

/** The systems shown, jobforge last; ratios are jobforge ÷ each of the others. */
const TABLE_ORDER = ['graphile', 'graphileBatched', 'bullmq', 'jobforge'];

function printTable(results) {
  const shown = TABLE_ORDER.filter((k) => results.systems[k]);
  const jf = results.systems.jobforge;
  const others = shown.filter((k) => k !== 'jobforge');
  const rows = [];
  /** A row: label, the figure of each system (get(s) → number or null), how to show it. */
  const row = (label, get, show) => {
    const cell = (s) => {
      if (!s) return 'not run';
      if (!s.available) return 'skipped';
      const v = get(s);
      return v === null || v === undefined ? (s.errors.length ? 'error' : '–') : show(v);
    };
    const b = jf?.available ? get(jf) : null;
    const ratio = (k) => {
      const s = results.systems[k];
      const a = s?.available ? get(s) : null;
      return a && b ? (b / a).toFixed(2) : '–';
    };
    rows.push([label, ...shown.map((k) => cell(results.systems[k])), ...(jf ? others.map(ratio) : [])]);
  };
  const jobsPerS = (v) => `${fmt(v)} jobs/s`;
  for (const p of results.config.procs) row(`throughput, ${p} process${p > 1 ? 'es' : ''}`, (s) => s.throughput[p]?.jobsPerS, jobsPerS);
  row(
    'settled in the table after the last handler (worst point)',
    (s) => {
      const v = Object.values(s.throughput).map((r) => r?.settleLagMs).filter(Number.isFinite);
      return v.length ? Math.max(...v) : null;
    },
    fmtMs,
  );
  row(`enqueue, single calls, ${results.config.inflight} in flight`, (s) => s.enqueue?.jobsPerS, jobsPerS);
  row(`enqueue, single calls, ${results.config.inflight} in flight (jobforge: groupStarts false)`, (s) => s.enqueue?.ungroupedJobsPerS ?? s.enqueue?.jobsPerS, jobsPerS);
  row('enqueue, bulk calls of 1,000 (addJobs / startMany)', (s) => s.enqueue?.bulkJobsPerS, jobsPerS);
  for (const k of ['p50', 'p90', 'p99', 'max']) row(`start latency ${k}`, (s) => s.latency?.[k], fmtMs);
  const head = ['', ...shown.map((k) => results.systems[k].label), ...(jf ? others.map((k) => `jf/${results.systems[k].label}`) : [])];
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)) + 2);
  console.log('');
  console.log(head.map((h, i) => pad(h, w[i])).join('').trimEnd());
  for (const r of rows) console.log(r.map((c, i) => pad(c, w[i])).join('').trimEnd());
  console.log('(ratio > 1: jobforge faster for throughput and enqueue; ratio < 1: jobforge quicker to start a job)');
}

async function main(args) {
  const wall0 = nowMs();
  const url = process.env.JOBFORGE_PG_URL || DEFAULT_URL;
  const command = `node bench/pg.js${process.argv.length > 2 ? ` ${process.argv.slice(2).join(' ')}` : ''}`;
  const results = {
    version: 1,
    kind: 'pg',
    startedAt: new Date().toISOString(),
    command,
    url: redact(url),
    machine: { node: process.version, cpus: os.cpus().length, cpuModel: os.cpus()[0]?.model ?? null, postgres: null },
    load: { start: os.loadavg(), end: null },
    config: {
      n: args.n,
      reps: args.reps,
      procs: args.procs,
      concurrency: args.concurrency,
      pool: args.pool,
      inflight: args.inflight,
      enqueueN: args.enqueueN,
      bulkN: args.bulkN,
      rate: args.rate,
      seconds: args.seconds,
      latencyProcs: 1,
      limitS: args.limitS,
      method: {
        enqueue: '`enqueueN` single-job enqueue calls (graphile-worker addJob, jobforge start), `inflight` outstanding, into an empty schema, no worker running, after 200 warm-up calls; jobforge twice, grouped starts (default) and groupStarts false (ungroupedJobsPerS), on fresh schemas, alternating which goes first by repetition; then `bulkN` jobs in bulk calls of 1000 (graphile-worker addJobs, jobforge startMany), one call at a time, into an empty schema after one warm-up call (bulkJobsPerS)',
        repetitions: 'each repetition runs every scenario for both systems, alternating which goes first; each figure of a point is the median over repetitions (all repetitions under reps)',
        throughput:
          "backlog of n jobs enqueued with no worker running (graphile-worker: addJobs, 1000 per call; jobforge: start(), `inflight` outstanding), not timed; workers forked and loaded, then started together; first handler start to last handler return across all workers; every index must run exactly once; settleLagMs: from the last handler return until the table first holds no unsettled job (polled every 5 ms from 98% of the handlers on)",
        latency:
          'one idle worker process; jobs enqueued at `rate`/s for `seconds` s after rate/2 warm-up jobs (not counted); handler start minus the enqueue time carried in the input (taken just before the enqueue call)',
      },
    },
    systems: {},
    ratios: null,
    skipped: null,
  };
  const writeJson = () => {
    if (!args.json) return;
    fs.writeFileSync(args.json, `${JSON.stringify(results, null, 2)}\n`);
    console.log(`results: ${path.relative(process.cwd(), args.json) || args.json}`);
  };

  console.log(`# reproduce: cd ${ROOT} && JOBFORGE_PG_URL=${redact(url)} ${command}`);

  // Postgres reachable?
  let Pg;
  try {
    Pg = require('pg');
  } catch (e) {
    results.skipped = `the pg package is missing (npm install): ${e.message.split('\n')[0]}`;
    console.log(`bench/pg.js: ${results.skipped}; skipped`);
    writeJson();
    return;
  }
  const pg = new Pg.Client({ connectionString: url, connectionTimeoutMillis: 5000 });
  try {
    await pg.connect();
    results.machine.postgres = (await pg.query('show server_version')).rows[0].server_version;
  } catch (e) {
    results.skipped = `PostgreSQL unreachable at ${redact(url)} (${e.message}); set JOBFORGE_PG_URL to a reachable database`;
    console.log(`bench/pg.js: ${results.skipped}. Skipped.`);
    try {
      await pg.end();
    } catch {}
    writeJson();
    return;
  }
  pg.on('error', () => {});

  console.log(
    `# node ${process.version}, ${os.cpus().length} CPU(s) (${os.cpus()[0]?.model ?? '?'}), PostgreSQL ${results.machine.postgres} at ${redact(url)}`,
  );
  const load = results.load.start.map((x) => x.toFixed(2)).join(' / ');
  console.log(`# load average (1/5/15 min) at start: ${load}${results.load.start[0] >= 1 ? ': the machine is busy, figures move with other load' : ''}`);
  console.log(
    `# enqueue: ${fmt(args.enqueueN)} single-job calls, ${args.inflight} in flight (jobforge grouped and not), then ${fmt(args.bulkN)} jobs in bulk calls of 1,000; empty schema, no worker running`,
  );
  console.log(
    `# throughput: N=${fmt(args.n)} no-op jobs, ${args.procs.join('/')} worker process(es) x concurrency ${args.concurrency}, pool ${args.pool} connections each; backlog enqueued first (not timed), then the workers started together; first handler start to last handler return`,
  );
  console.log(
    `# latency: 1 idle worker process, ${args.rate} jobs/s for ${args.seconds} s (+${Math.ceil(args.rate / 2)} warm-up jobs), enqueue time in the input, handler start minus enqueue time`,
  );

  const names = Object.keys(SYSTEMS).filter((n) => !args.only || args.only.includes(n));
  const opt = { url, n: args.n, concurrency: args.concurrency, pool: args.pool, inflight: args.inflight, enqueueN: args.enqueueN, bulkN: args.bulkN, rate: args.rate, seconds: args.seconds, limitS: args.limitS, prefetch: args.prefetch };
  const live = [];
  for (const name of names) {
    const sys = SYSTEMS[name];
    const s = { label: sys.label, schema: sys.schema, available: false, reason: null, version: null, config: null, enqueue: null, throughput: {}, latency: null, errors: [], reps: { enqueue: [], throughput: {}, latency: [] } };
    results.systems[name] = s;
    try {
      const p = await sys.probe({ url, pool: args.pool, prefetch: args.prefetch });
      s.available = true;
      s.version = p.version;
      s.config = p.config;
      live.push(name);
      console.log(`# ${p.config}`);
    } catch (e) {
      s.reason = e.message;
      console.log(`# ${sys.label}: skipped: ${e.message}`);
    }
  }

  // Each repetition runs every scenario for both systems, the order of the
  // systems alternating, so drift of the machine affects both alike; the
  // summary of a point is the median of each figure over repetitions.
  const log = (kind, s, what, text) => console.log(`${pad(kind, 10)} ${pad(s.label, 15)} ${what}${text}`);
  const fail = (s, name, key, e, label, what = '') => {
    log(label, s, what, `ERROR ${e.message.split('\n')[0]}`);
    s.errors.push(`${key}: ${e.message}`);
    if (name === 'jobforge') s.failed = true; // a backend in progress: stop at its first error
  };
  for (let rep = 0; rep < args.reps; rep++) {
    if (args.reps > 1) console.log(`-- repetition ${rep + 1}/${args.reps}`);
    const ordered = (k) => ((rep + k) % 2 === 0 ? live : [...live].reverse());
    for (const name of ordered(0)) {
      const s = results.systems[name];
      if (s.failed) continue;
      try {
        const r = await enqueuePoint(pg, name, opt, rep);
        s.reps.enqueue.push(r);
        const ungrouped = r.ungroupedJobsPerS === undefined ? '' : `; ${fmt(r.ungroupedJobsPerS)} jobs/s with groupStarts false, grouped/ungrouped ${(r.jobsPerS / r.ungroupedJobsPerS).toFixed(2)}`;
        log('enqueue', s, '', `${fmt(r.jobsPerS)} jobs/s (${fmt(r.jobs)} single calls, ${r.inflight} in flight${ungrouped}); bulk ${fmt(r.bulkJobsPerS)} jobs/s (${fmt(r.bulkJobs)} in calls of ${fmt(r.bulkBatch)})`);
      } catch (e) {
        fail(s, name, 'enqueue', e, 'enqueue');
      }
    }
    for (const [pi, procs] of args.procs.entries()) {
      for (const name of ordered(pi + 1)) {
        const s = results.systems[name];
        if (s.failed) continue;
        try {
          const r = await throughputPoint(pg, name, procs, opt);
          (s.reps.throughput[procs] ??= []).push(r);
          const flags = [r.timedOut && 'TIMED OUT', r.missing && `${r.missing} missing`, r.duplicates && `${r.duplicates} ran twice`, r.pendingAfter && `${r.pendingAfter} not completed in the table`]
            .filter(Boolean)
            .join(', ');
          log(
            'throughput',
            s,
            `${procs} proc: `,
            `${fmt(r.jobsPerS)} jobs/s (${fmt(r.ran)} jobs in ${r.seconds.toFixed(2)} s; per process ${r.perProc.map(fmt).join('/')}; start skew ${r.startSkewMs.toFixed(0)} ms; all settled in the table ${r.settleLagMs === null ? '?' : `${r.settleLagMs.toFixed(0)} ms`} after the last handler; backlog ${r.backlog.how}, ${r.backlog.seconds.toFixed(1)} s)${flags ? ` ${flags}` : ''}`,
          );
        } catch (e) {
          fail(s, name, `throughput ${procs}`, e, 'throughput', `${procs} proc: `);
        }
      }
    }
    for (const name of ordered(args.procs.length + 1)) {
      const s = results.systems[name];
      if (s.failed) continue;
      try {
        const r = await latencyPoint(pg, name, opt);
        s.reps.latency.push(r);
        log(
          'latency',
          s,
          '',
          `${fmt(r.measured)} jobs at ${fmt(r.achievedRate)}/s: p50 ${fmtMs(r.p50)}, p90 ${fmtMs(r.p90)}, p99 ${fmtMs(r.p99)}, max ${fmtMs(r.max)} (enqueue call p50 ${fmtMs(r.enqueueCallP50)})${r.timedOut ? ' TIMED OUT' : ''}`,
        );
      } catch (e) {
        fail(s, name, 'latency', e, 'latency');
      }
    }
  }
  for (const name of live) {
    const s = results.systems[name];
    s.enqueue = summarize(s.reps.enqueue);
    for (const p of args.procs) s.throughput[p] = summarize(s.reps.throughput[p] ?? []);
    s.latency = summarize(s.reps.latency);
  }
  results.load.end = os.loadavg();

  // Leave the database as we found it.
  for (const name of names) {
    const sys = SYSTEMS[name];
    if (sys.schema) await pg.query(`DROP SCHEMA IF EXISTS ${sys.schema} CASCADE`).catch(() => {});
    else if (results.systems[name]?.available) await withClient(sys, { url, pool: 2 }, (c) => c.drop?.()).catch(() => {});
  }
  await pg.end();

  const jf = results.systems.jobforge;
  const gw = results.systems.graphile;
  if (jf?.available && gw?.available) {
    const r = (a, b) => (Number.isFinite(a) && Number.isFinite(b) && b > 0 ? a / b : null);
    results.ratios = {
      note: 'jobforge / graphile-worker: throughput > 1 means jobforge is faster, latency < 1 means jobforge starts jobs sooner',
      throughput: Object.fromEntries(args.procs.map((p) => [p, r(jf.throughput[p]?.jobsPerS, gw.throughput[p]?.jobsPerS)])),
      enqueue: r(jf.enqueue?.jobsPerS, gw.enqueue?.jobsPerS),
      enqueueBulk: r(jf.enqueue?.bulkJobsPerS, gw.enqueue?.bulkJobsPerS),
      enqueueGroupedVsUngrouped: r(jf.enqueue?.jobsPerS, jf.enqueue?.ungroupedJobsPerS),
      latencyP50: r(jf.latency?.p50, gw.latency?.p50),
      latencyP99: r(jf.latency?.p99, gw.latency?.p99),
    };
  }
  // jobforge ÷ each other system (`ratios` above stays jobforge ÷ plain graphile-worker).
  results.ratiosBy = {};
  for (const k of TABLE_ORDER) {
    const o = results.systems[k];
    if (k === 'jobforge' || !jf?.available || !o?.available) continue;
    const r = (a, b) => (Number.isFinite(a) && Number.isFinite(b) && b > 0 ? a / b : null);
    results.ratiosBy[k] = {
      throughput: Object.fromEntries(args.procs.map((p) => [p, r(jf.throughput[p]?.jobsPerS, o.throughput[p]?.jobsPerS)])),
      enqueue: r(jf.enqueue?.jobsPerS, o.enqueue?.jobsPerS),
      latencyP50: r(jf.latency?.p50, o.latency?.p50),
      latencyP99: r(jf.latency?.p99, o.latency?.p99),
    };
  }
  printTable(results);
  for (const [k, q] of Object.entries(results.ratiosBy)) {
    const f = (x) => (x === null ? '–' : x.toFixed(2));
    console.log(
      `ratio jobforge/${results.systems[k].label}: drain ${args.procs.map((p) => `${p}p ${f(q.throughput[p])}`).join(', ')}; latency p50 ${f(q.latencyP50)}, p99 ${f(q.latencyP99)}`,
    );
  }
  if (results.ratios) {
    const t = results.ratios.throughput;
    const f = (x) => (x === null ? '–' : x.toFixed(2));
    console.log(
      `ratio jobforge/graphile-worker: throughput ${args.procs.map((p) => `${p}p ${f(t[p])}`).join(', ')}; enqueue ${f(results.ratios.enqueue)}, bulk ${f(results.ratios.enqueueBulk)} (jobforge grouped/ungrouped ${f(results.ratios.enqueueGroupedVsUngrouped)}); latency p50 ${f(results.ratios.latencyP50)}, p99 ${f(results.ratios.latencyP99)}`,
    );
  } else {
    console.log('ratio jobforge/graphile-worker: – (needs both systems)');
  }
  // A system that ran but failed, or lost or repeated jobs, fails the run
  // (a skipped one does not; a timed-out point is flagged, not failed).
  const problems = [];
  for (const name of live) {
    const s = results.systems[name];
    for (const e of s.errors) problems.push(`${s.label}: ${e.split('\n')[0]}`);
    for (const r of Object.values(s.reps.throughput).flat()) {
      if (r.duplicates || r.outOfRange || (r.missing && !r.timedOut)) problems.push(`${s.label}, ${r.procs} proc: ${r.missing} jobs missing, ${r.duplicates} ran twice`);
    }
  }
  results.problems = problems;
  for (const p of problems) console.log(`PROBLEM ${p}`);
  if (problems.length) process.exitCode = 1;
  results.durationS = (nowMs() - wall0) / 1000;
  console.log(`total ${results.durationS.toFixed(0)} s; load average at end ${results.load.end.map((x) => x.toFixed(2)).join(' / ')}`);
  writeJson();
  if (args.docs) writeDocs(results, command);
}

/**
 * `--docs`: rewrites section 6 of BENCHMARKS.md (inside the block bench/run.js
 * generates, from its "### 6." heading to the next "### ") with this run,
 * through bench/report.js's own renderer, so the rest of the block stays as
 * the last full `npm run bench` wrote it (its Targets table included).
 */
function writeDocs(results, command) {
  const report = require('./report');
  const file = path.join(ROOT, 'BENCHMARKS.md');
  const md = fs.readFileSync(file, 'utf8');
  const head = '### 6. PostgreSQL backend vs graphile-worker (`bench/pg.js`)';
  const at = md.indexOf(head);
  const end = at < 0 ? -1 : md.indexOf('\n### ', at + head.length);
  if (at < 0 || end < 0) {
    console.log('BENCHMARKS.md has no section 6 to rewrite: left as it is');
    return;
  }
  const body = report.pgSection({ command, pg: { present: true, direct: true, data: results, command, status: process.exitCode ?? 0, wallS: results.durationS } });
  fs.writeFileSync(file, `${md.slice(0, at)}${head}\n\n${body}\n${md.slice(end)}`);
  console.log('wrote section 6 of BENCHMARKS.md');
}

const args = parseArgs(process.argv.slice(2));
if (args.worker) {
  process.on('uncaughtException', fail);
  process.on('unhandledRejection', fail);
  workerMain(args.worker).catch(fail);
} else {
  main(args).catch((e) => {
    console.error(e);
    process.exitCode = 1;
  });
}
