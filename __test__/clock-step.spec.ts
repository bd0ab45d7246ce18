// A run's timeout counts elapsed time, which a step of the wall clock (an
// NTP correction, a resumed VM) does not move. The wall clock is stepped
// for a child process by a tiny LD_PRELOAD shim built here with the C
// compiler (skipped, with a message, where there is none).
import test from 'ava';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

const SHIM = `
#define _GNU_SOURCE
#include <time.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
/* CLOCK_REALTIME shifted by the ms written in $JUMP_FILE. */
static long long offset_ms(void) {
  const char *f = getenv("JUMP_FILE"); if (!f) return 0;
  FILE *fp = fopen(f, "r"); if (!fp) return 0;
  long long v = 0; if (fscanf(fp, "%lld", &v) != 1) v = 0; fclose(fp); return v;
}
int clock_gettime(clockid_t id, struct timespec *ts) {
  static int (*real)(clockid_t, struct timespec *) = 0;
  if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
  int r = real(id, ts);
  if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ms() * 1000000LL;
    ts->tv_sec = ns / 1000000000LL; ts->tv_nsec = ns % 1000000000LL;
  }
  return r;
}
int gettimeofday(struct timeval *tv, void *tz) {
  struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
  tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; return 0;
}
`;

/** Runs a timeout scenario in a child whose wall clock steps by `stepMs` after 300 ms. */
const CHILD = `
const fs = require('node:fs');
const { JobOrchestrator } = require(process.env.DIST);
const quiet = { log() {}, info() {}, warn() {}, error() {}, debug() {} };
(async () => {
  const o = new JobOrchestrator({ loggerFactory: () => quiet, logger: quiet });
  const t0 = process.hrtime.bigint();
  const ms = () => Math.round(Number(process.hrtime.bigint() - t0) / 1e6);
  const abortedAt = {};
  const h = (ctx) => new Promise((r) => ctx.signal.addEventListener('abort', () => { abortedAt[ctx.input.name] = ms(); r(); }));
  o.registerHandler('long', { timeoutMs: 60000 }, h);
  o.registerHandler('short', { timeoutMs: 1500 }, h);
  const w = o.startWorker({ pools: { batch: { concurrency: 5 } }, shutdownTimeoutMs: 0 });
  const a = await o.start('long', { name: 'long' });
  const b = await o.start('short', { name: 'short' });
  await new Promise((r) => setTimeout(r, 300));
  fs.writeFileSync(process.env.JUMP_FILE, process.env.STEP_MS);
  await new Promise((r) => setTimeout(r, 2700));
  const out = { long: (await o.findById(a.id)).status, short: (await o.findById(b.id)).status, abortedAt };
  await w.stop();
  console.log(JSON.stringify(out));
  process.exit(0);
})();
`;

function shim(): string | null {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'jf-clock-'));
  fs.writeFileSync(path.join(dir, 'jump.c'), SHIM);
  const so = path.join(dir, 'jump.so');
  const cc = spawnSync('cc', ['-shared', '-fPIC', '-O1', '-o', so, path.join(dir, 'jump.c'), '-ldl'], { encoding: 'utf8' });
  return cc.status === 0 ? so : null;
}

const so = process.platform === 'linux' ? shim() : null;

for (const [name, stepMs] of [
  ['forward an hour', 3_600_000],
  ['back an hour', -3_600_000],
] as const) {
  const title = `a wall-clock step ${name} neither times runs out early nor holds their timeout back`;
  if (so === null) {
    test(title, (t) => t.pass('skipped: no C compiler to build the clock shim (LD_PRELOAD, Linux)'));
    continue;
  }
  test(title, (t) => {
    const jump = path.join(path.dirname(so), `offset-${stepMs}`);
    fs.writeFileSync(jump, '0');
    const r = spawnSync(process.execPath, ['-e', CHILD], {
      encoding: 'utf8',
      timeout: 30_000,
      env: { ...process.env, LD_PRELOAD: so, JUMP_FILE: jump, STEP_MS: String(stepMs), DIST: path.join(__dirname, '..', 'dist') },
    });
    t.is(r.status, 0, r.stderr);
    const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { long: string; short: string; abortedAt: Record<string, number> };
    t.log(JSON.stringify(out));
    t.is(out.long, 'running', 'the 60 s timeout did not fire');
    t.is(out.short, 'timed_out', 'the 1.5 s timeout fired');
    t.true(out.abortedAt.short! >= 1400 && out.abortedAt.short! < 2900, `short aborted at ${out.abortedAt.short} ms`);
  });
}
