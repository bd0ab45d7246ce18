/**
 * An orchestrator nobody references any more is garbage-collected, and the
 * engine's native memory (every run it held) with it. The engine holds its
 * JS callbacks through threadsafe functions, which the collector cannot see
 * through; a callback that kept the orchestrator alive leaked all of it.
 *
 * Each test runs in a child Node with `--expose-gc` and counts finalized
 * orchestrators and engines with a FinalizationRegistry.
 */
import test from 'ava';
import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { forBackends } from './backends';

const DIST = path.resolve(__dirname, '../dist');

/** The child: builds `count` orchestrators, uses each one `way`, drops them, collects, reports. */
const CHILD = `
const { JobOrchestrator } = require(${JSON.stringify(DIST)});
const { options, way, count, runs, collectEach } = JSON.parse(process.argv[1]);
const quiet = { log() {}, warn() {}, error() {}, debug() {} };
const finalized = { orchestrators: 0, engines: 0 };
const registry = new FinalizationRegistry((k) => finalized[k]++);
class Noop { async run() { return { ok: true }; } }
const collect = async (passes = 8) => {
  for (let i = 0; i < passes; i++) {
    gc();
    await new Promise((r) => setTimeout(r, 20));
  }
};
// Its own function, so no stack slot of the caller keeps the last one.
async function useOne(first) {
  const o = new JobOrchestrator({ ...options, loggerFactory: () => quiet });
  registry.register(o, 'orchestrators');
  registry.register(o.store.native, 'engines');
  if (o.backend === 'postgres' && first) await o.migrate();
  o.registerHandler('life.noop', { pool: 'batch' }, Noop);
  const ids = [];
  for (let i = 0; i < runs; i++) ids.push((await o.start('life.noop', { n: i })).id);
  if (way === 'tick') {
    const run = await o.claimNext('batch');
    await o.tick(run.id);
  } else if (way === 'worker') {
    const w = o.startWorker();
    await o.waitForRun(ids[ids.length - 1], { timeoutMs: 20000 });
    await w.stop();
  } else if (way === 'events' || way === 'events-unclosed') {
    const seen = [];
    o.on('run:completed', (r) => seen.push(r.id));
    const run = await o.claimNext('batch');
    await o.tick(run.id);
    if (seen.length !== 1) throw new Error('run:completed not emitted');
    // Dropped while listening (Postgres: its engine listens to other
    // processes and keeps Node running for it) without close().
    if (way === 'events-unclosed') return;
  }
  await o.close();
}
(async () => {
  const rss = [];
  for (let k = 0; k < count; k++) {
    await useOne(k === 0);
    // V8 does not see the engines' native memory, so it feels no pressure
    // to collect them; here it is told to after each one.
    if (collectEach) await collect(2);
    if (k === Math.floor(count / 3) - 1 || k === count - 1) {
      await collect();
      rss.push(process.memoryUsage().rss);
    }
  }
  await collect();
  process.stdout.write(JSON.stringify({ ...finalized, rss }));
  process.exit(0);
})().catch((e) => {
  process.stderr.write(String(e && e.stack || e));
  process.exit(1);
});
`;

interface Report {
  orchestrators: number;
  engines: number;
  rss: number[];
}

/** Runs `script` in a child Node (from the project root) and returns its stdout; throws if it fails. */
function runNode(flags: string[], script: string, ...args: string[]): string {
  const res = spawnSync(process.execPath, [...flags, '-e', script, ...args], {
    cwd: path.resolve(__dirname, '..'),
    encoding: 'utf8',
    timeout: 90_000,
  });
  if (res.status !== 0) throw new Error(`child failed (${String(res.status ?? res.signal)}): ${res.stderr || res.stdout}`);
  return res.stdout;
}

function runChild(options: object, way: string, count: number, runs: number, collectEach = false): Report {
  const arg = JSON.stringify({ options, way, count, runs, collectEach });
  return JSON.parse(runNode(['--expose-gc'], CHILD, arg)) as Report;
}

for (const way of ['plain', 'tick', 'worker', 'events']) {
  forBackends(`an orchestrator dropped after use (${way}) is collected, and its engine with it`, async (t, make) => {
    const count = make.backend === 'memory' ? 6 : 3;
    const r = runChild(make.options(), way, count, 50);
    // Every one of them: none is referenced once its use is over.
    t.is(r.orchestrators, count);
    t.is(r.engines, count);
  });
}

forBackends('an orchestrator dropped while it listens, without close(): memory collects it; PostgreSQL keeps it, as a listener keeps the process alive until off() or close()', async (t, make) => {
  const count = make.backend === 'memory' ? 6 : 3;
  const r = runChild(make.options(), 'events-unclosed', count, 50);
  // Memory hears only its own runs: nothing keeps a dropped one. On
  // PostgreSQL its engine listens to other processes for the listener,
  // which (as documented) holds it until off() or close().
  const kept = make.backend === 'memory' ? 0 : count;
  t.is(r.orchestrators, count - kept);
  t.is(r.engines, count - kept);
});

test('[memory] dropped orchestrators give their runs’ native memory back: RSS stops growing', (t) => {
  // 60 orchestrators of 10,000 runs each (~3 MB of native memory apiece),
  // collected after each. Before the fix every one stayed alive: RSS rose
  // by ~120 MB between the 20th and the 60th. Now the memory of dropped
  // engines is reused.
  const r = runChild({}, 'plain', 60, 10_000, true);
  t.is(r.orchestrators, 60);
  const [after20, after60] = r.rss;
  const grewMb = (after60 - after20) / 1048576;
  t.true(grewMb < 30, `RSS grew by ${grewMb.toFixed(1)} MB between the 20th and the 60th orchestrator`);
});

test('[memory] without forced GC, V8 collects dropped orchestrators because it is told their native size', (t) => {
  // V8 only sees a small JS object per orchestrator; the engine reports its
  // runs' native memory (napi adjust_external_memory) so the collector
  // knows dropping it frees megabytes. 100 orchestrators of 20,000 runs
  // (~7 MB native each), no gc() call: without the report RSS grew by
  // ~7 MB per orchestrator (~480 MB from the 30th to the 100th).
  const script = `
    const { JobOrchestrator } = require(${JSON.stringify(DIST)});
    const quiet = { log() {}, warn() {}, error() {}, debug() {} };
    class Noop { async run() { return {}; } }
    (async () => {
      const rss = [];
      for (let k = 1; k <= 100; k++) {
        const o = new JobOrchestrator({ loggerFactory: () => quiet });
        o.registerHandler('life.noop', { pool: 'batch' }, Noop);
        let last;
        for (let i = 0; i < 20000; i++) last = await o.start('life.noop', { n: i });
        await o.findById(last.id);
        await new Promise((r) => setImmediate(r));
        if (k === 30 || k === 100) rss.push(process.memoryUsage().rss);
      }
      process.stdout.write(JSON.stringify(rss));
    })();
  `;
  const [at30, at100] = JSON.parse(runNode([], script)) as number[];
  const grewMb = (at100 - at30) / 1048576;
  t.true(grewMb < 200, `RSS grew by ${grewMb.toFixed(0)} MB from the 30th to the 100th orchestrator`);
});

test('[memory] a Nest app closed and dropped leaves its orchestrator collectable', (t) => {
  // JobsModule with its worker: app.close() stops the worker, and nothing
  // Nest or the module keeps may hold the orchestrator afterwards.
  const script = `
    require('reflect-metadata');
    const { Test } = require('@nestjs/testing');
    const nest = require(${JSON.stringify(path.join(DIST, 'nest'))});
    let collected = 0;
    const registry = new FinalizationRegistry(() => collected++);
    async function one() {
      const mod = await Test.createTestingModule({ imports: [nest.JobsModule.forRoot({ worker: true })] }).compile();
      const app = mod.createNestApplication();
      await app.init();
      const jobs = app.get(nest.JOB_ORCHESTRATOR);
      registry.register(jobs, 1);
      if (!(await jobs.countByPoolAndStatus())) throw new Error('orchestrator not usable');
      await app.close();
    }
    (async () => {
      for (let k = 0; k < 4; k++) await one();
      for (let i = 0; i < 8; i++) {
        gc();
        await new Promise((r) => setTimeout(r, 20));
      }
      process.stdout.write(String(collected));
      process.exit(0);
    })().catch((e) => {
      process.stderr.write(String((e && e.stack) || e));
      process.exit(1);
    });
  `;
  t.is(Number(runNode(['--expose-gc'], script)), 4);
});
