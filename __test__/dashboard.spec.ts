/**
 * The dashboard (issue 25) over HTTP, as a browser would call it: pages,
 * filters, a run's detail with its error and timeline, actions with their
 * CSRF token, the authorize gate and tenant pinning, loopback read-only
 * without authorize, mounting under a base path, and hostile values from
 * every field of a run coming out escaped.
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createDashboard, JobOrchestrator } from '../dist';
import type { DashboardOptions, JobContext } from '../dist';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { forBackends, PG_URL, postgresOnly } from './backends';
import { hanging, manual } from './helpers';

async function serve(t: ExecutionContext, o: JobOrchestrator, opts: DashboardOptions = {}): Promise<string> {
  const handler = createDashboard(o, opts);
  const server = createServer((req, res) => handler(req, res));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function get(url: string): Promise<{ status: number; body: string; headers: Headers }> {
  const r = await fetch(url, { redirect: 'manual' });
  return { status: r.status, body: await r.text(), headers: r.headers };
}

async function post(url: string, form: Record<string, string>, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: new URLSearchParams(form).toString(),
  });
}

const csrfOf = (page: string): string => /name="csrf" value="([^"]+)"/.exec(page)?.[1] ?? '';

forBackends('dashboard: overview, runs filtered by status, and a failed run with its error and timeline', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dash.fail', {}, async (ctx: JobContext<unknown>) => {
    await ctx.step('prepare', () => 1);
    throw new Error('card declined');
  });
  o.registerHandler('dash.ok', {}, async () => ({ fine: true }));
  const bad = await o.start('dash.fail', { order: 7 });
  const good = await o.start('dash.ok', {});
  for (let i = 0; i < 2; i++) {
    const c = await o.claimNext('batch');
    await o.tick(c!.id);
  }
  const base = await serve(t, o);
  const home = await get(`${base}/`);
  t.is(home.status, 200);
  t.regex(home.headers.get('content-security-policy') ?? '', /default-src 'none'/);
  t.true(home.body.includes('dash.fail'), 'the failing job type is listed');
  t.true(home.body.includes('card declined'));
  t.true(home.body.includes('Read-only'), 'says it is read-only without authorize');
  t.true(home.body.includes('<svg class="chart"'), 'the last hour as a chart');
  t.regex(home.body, /1 completed <span class="k bad"><\/span>1 failed or timed out/);

  const failed = await get(`${base}/runs?status=failed`);
  t.true(failed.body.includes(bad.id.slice(0, 8)));
  t.false(failed.body.includes(good.id.slice(0, 8)), 'the filter leaves the completed run out');
  t.is((await get(`${base}/runs?status=bogus`)).status, 400);

  const detail = await get(`${base}/runs/${bad.id}`);
  t.is(detail.status, 200);
  for (const s of ['card declined', 'prepare', 'started', 'step_completed', 'failed', '&quot;order&quot;: 7']) {
    t.true(detail.body.includes(s), s);
  }
  t.false(detail.body.includes('name="csrf"'), 'no action forms when read-only');
  t.is((await get(`${base}/runs/00000000-0000-4000-8000-000000000000`)).status, 404);
  t.is((await get(`${base}/nowhere`)).status, 404);
  // A malformed %-escape is the client's error, not a 500.
  t.is((await get(`${base}/runs/%`)).status, 400);
  t.is((await get(`${base}/runs/%E0%A4%A`)).status, 400);
  const refused = await post(`${base}/runs/${bad.id}/replay`, { csrf: 'x' });
  t.is(refused.status, 403, 'no actions without authorize');
});

// A run page drew its root's whole tree: among 20,000 siblings, a page of
// megabytes on every load and live refresh. A tree over 200 runs is listed
// on the runs page (its pages) instead of drawn.
forBackends('dashboard: a run in a large tree links to the tree\'s runs instead of drawing them all', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dash.tree', {}, async () => ({}));
  const parent = await o.start('dash.tree', {});
  const kids = await o.startMany(Array.from({ length: 210 }, (_, i) => ({ type: 'dash.tree', input: { i }, opts: { parentRunId: parent.id } })));
  const small = await o.start('dash.tree', {});
  const smallKid = await o.start('dash.tree', {}, { parentRunId: small.id });
  const base = await serve(t, o);
  const page = await get(`${base}/runs/${kids[0]!.id}`);
  t.is(page.status, 200);
  t.true(page.body.length < 30_000, `${page.body.length} bytes`);
  t.false(page.body.includes(kids[209]!.id.slice(0, 8)), 'the siblings are not drawn');
  const list = /href="([^"]*\/runs\?root=[^"]*)"/.exec(page.body)?.[1]?.replace(/&amp;/g, '&');
  t.truthy(list, 'a link to the tree\'s runs');
  const listed = await get(`${base}${list}`);
  t.is(listed.status, 200);
  t.true(kids.filter((k) => listed.body.includes(k.id.slice(0, 8))).length >= 49, "a page of the tree's runs (the root may be among them)");
  t.false(listed.body.includes(small.id.slice(0, 8)), 'another tree is not');
  // A small tree is still drawn whole.
  const smallPage = await get(`${base}/runs/${smallKid.id}`);
  t.true(smallPage.body.includes('(this run)') && smallPage.body.includes(small.id.slice(0, 8)));
});

test('dashboard: with authorize, cancel from the page needs its token and the same origin', async (t) => {
  const o = manual();
  const h = hanging();
  o.registerHandler('dash.hang', {}, h.handler);
  const run = await o.start('dash.hang', {});
  const claimed = await o.claimNext('batch');
  const ticking = o.tick(claimed!.id);
  await h.entered();
  const asked: string[] = [];
  const base = await serve(t, o, {
    authorize: (req, action) => {
      asked.push(action);
      return req.headers['x-user'] !== 'mallory';
    },
  });
  const page = await get(`${base}/runs/${run.id}`);
  t.true(page.body.includes('Cancel run'));
  t.false(page.body.includes('Read-only'));
  const csrf = csrfOf(page.body);
  t.true(csrf.length > 20);
  t.is((await post(`${base}/runs/${run.id}/cancel`, { csrf: 'forged' })).status, 403, 'a wrong token');
  t.is((await post(`${base}/runs/${run.id}/cancel`, {})).status, 403, 'no token');
  t.is((await post(`${base}/runs/${run.id}/cancel`, { csrf }, { origin: 'https://evil.example' })).status, 403, 'another origin');
  t.is((await post(`${base}/runs/${run.id}/cancel`, { csrf }, { 'x-user': 'mallory' })).status, 403, 'authorize said no');
  t.is((await fetch(`${base}/runs/${run.id}`, { headers: { 'x-user': 'mallory' } })).status, 403);
  t.is((await o.getRun(run.id))?.status, 'running', 'nothing refused changed the run');
  const ok = await post(`${base}/runs/${run.id}/cancel`, { csrf }, { origin: base });
  t.is(ok.status, 303);
  t.is(ok.headers.get('location'), `/runs/${run.id}`);
  t.is((await o.getRun(run.id))?.status, 'canceled');
  await ticking;
  const after = await get(`${base}/runs/${run.id}`);
  t.true(after.body.includes('Replay'), 'a terminal run offers replay');
  t.true(after.body.includes('&quot;reason&quot;: &quot;requested&quot;'), 'the timeline shows the cancel');
  t.true(asked.includes('read') && asked.includes('cancel'));
  t.is((await post(`${base}/runs/${run.id}/replay`, { csrf: csrfOf(after.body) })).status, 403, 'no Origin nor Referer');
  t.is((await post(`${base}/runs/${run.id}/replay`, { csrf: csrfOf(after.body) }, { referer: `${base}/runs/${run.id}` })).status, 303);
  t.is((await o.getRun(run.id))?.status, 'pending');
  // The same form sent again (a double submit, a stale page): the run is
  // no longer terminal, a conflict (409), not a server error.
  t.is((await post(`${base}/runs/${run.id}/replay`, { csrf: csrfOf(after.body) }, { origin: base })).status, 409);
  t.is((await post(`${base}/runs/%/cancel`, { csrf: csrfOf(after.body) }, { origin: base })).status, 400);
  t.is((await o.getRun(run.id))?.status, 'pending');
});

test('dashboard: authorize pins the tenant; another tenant\'s run is not found', async (t) => {
  const o = manual({ multiTenant: true });
  o.registerHandler('dash.t', {}, async () => ({}));
  const mine = await o.start('dash.t', {}, { tenantId: 'a' });
  const theirs = await o.start('dash.t', {}, { tenantId: 'b' });
  const base = await serve(t, o, { authorize: () => ({ tenantId: 'a' }) });
  t.is((await get(`${base}/runs/${mine.id}`)).status, 200);
  t.is((await get(`${base}/runs/${theirs.id}?tenant=b`)).status, 404, '?tenant= cannot widen a pinned tenant');
  const list = await get(`${base}/runs?tenant=b`);
  t.true(list.body.includes(mine.id.slice(0, 8)));
  t.false(list.body.includes(theirs.id.slice(0, 8)));
  const page = await get(`${base}/runs/${mine.id}`);
  t.is((await post(`${base}/runs/${theirs.id}/cancel`, { csrf: csrfOf(page.body) }, { origin: base })).status, 404);
  t.is((await o.getRun(theirs.id, 'b'))?.status, 'pending');
});

// A malformed verdict fails closed: `{ tenantId: req.user.tenantId }` with
// the claim missing used to pin the tenant-less runs, and a tenant id
// answered as a bare string was taken as `true` (every tenant).
test('dashboard: an authorize answer that is not true, false or { tenantId } is refused (403), never widened', async (t) => {
  const o = manual({ multiTenant: true });
  o.registerHandler('dash.t', {}, async () => ({}));
  const untenanted = await o.start('dash.t', {}, { tenantId: null });
  const theirs = await o.start('dash.t', {}, { tenantId: 'b' });
  for (const verdict of [{ tenantId: undefined }, {}, 'a', 1]) {
    const base = await serve(t, o, { authorize: () => verdict as never });
    t.is((await get(`${base}/runs/${untenanted.id}`)).status, 403, JSON.stringify(verdict));
    t.is((await get(`${base}/runs/${theirs.id}?tenant=b`)).status, 403, JSON.stringify(verdict));
  }
  const nullPinned = await serve(t, o, { authorize: () => ({ tenantId: null }) });
  t.is((await get(`${nullPinned}/runs/${untenanted.id}`)).status, 200, 'null said is the tenant-less runs');
  t.is((await get(`${nullPinned}/runs/${theirs.id}?tenant=b`)).status, 404);
});

test('dashboard: mounted under a base path, its links stay under it', async (t) => {
  const o = manual();
  o.registerHandler('dash.b', {}, async () => ({}));
  const run = await o.start('dash.b', {});
  const base = await serve(t, o, { basePath: '/ops/jobs/' });
  const home = await get(`${base}/ops/jobs`);
  t.is(home.status, 200);
  t.true(home.body.includes('href="/ops/jobs/runs"'));
  const runs = await get(`${base}/ops/jobs/runs`);
  t.true(runs.body.includes(`href="/ops/jobs/runs/${run.id}"`));
  t.throws(() => createDashboard(o, { basePath: 'jobs' }), { instanceOf: TypeError });
});

test('dashboard: hostile values from every field of a run come out escaped', async (t) => {
  const o = manual();
  const evil = ['<script>alert(1)</script>', '"><img src=x onerror=alert(1)>', 'javascript:alert(1)', "'><svg onload=alert(1)>"];
  const type = `${evil[0]}${evil[1]}`;
  o.registerHandler(type, { pool: 'p"><script>x</script>' }, async (ctx: JobContext<unknown>) => {
    await ctx.step(evil[1]!, () => 1);
    throw new Error(evil.join(' '));
  });
  const run = await o.start(type, { a: evil[0], [evil[1]!]: evil[2], b: evil[3] }, {
    tags: { t: evil[2]!, u: evil[0]! },
    scope: { entityType: evil[1]!, entityId: evil[0]! },
    triggerRef: evil[3],
  });
  await o.schedule(evil[1]!, { jobType: type, everyMs: 60_000 });
  const c = await o.claimNext('p"><script>x</script>');
  await o.tick(c!.id);
  const base = await serve(t, o);
  // A run waiting on a signal of a hostile name: its page (with actions) shows the name in the form.
  o.registerHandler('dash.evil-wait', {}, async (ctx: JobContext<unknown>) => ctx.waitForSignal('w', { signal: evil.join('') }));
  const waiting = await o.start('dash.evil-wait', {});
  await o.tick((await o.claimNext('batch'))!.id);
  const acting = await serve(t, o, { authorize: () => true });
  const e = encodeURIComponent;
  const pages = [
    ...[
      '/',
      '/runs',
      '/runs?status=failed',
      `/runs/${run.id}`,
      '/schedules',
      `/runs?pool=${e(evil[1]!)}`,
      `/runs?type=${e(type)}`,
      `/runs?scopeType=${e(evil[1]!)}&scopeId=${e(evil[0]!)}`,
    ].map((p) => `${base}${p}`),
    `${acting}/runs/${waiting.id}`,
  ];
  for (const p of pages) {
    const { status, body } = await get(p);
    t.is(status, 200, p);
    // The one script element is the dashboard's own.
    const own = body.replace(/<script src="\/assets\/live\.js" data-events="[^"<>]*" defer><\/script>/, '');
    t.false(/<script/i.test(own), `${p}: no other script element`);
    // The overview's chart is the one svg of its own (numbers and dates only).
    const noChart = body.replace(/<svg class="chart" [^>]*>(?:<(?:line|g|rect|title)[^>]*>[^<]*(?:<\/(?:title|rect|line)>)?|<\/g>)*<\/svg>/, '');
    t.false(/<img|<svg/i.test(noChart), `${p}: no injected element`);
    // Attribute values are quoted and cannot hold a quote (it is escaped):
    // with them blanked, any `on…=` left inside a tag would be a real attribute.
    const tags = body.replace(/"[^"]*"/g, '""');
    t.false(/<[a-z][^>]*\son[a-z]+=/i.test(tags), `${p}: no element with an injected handler attribute`);
    t.false(/href="javascript:/i.test(body), `${p}: no javascript: link`);
  }
  const detail = (await get(`${base}/runs/${run.id}`)).body;
  t.true(detail.includes('&lt;script&gt;alert(1)&lt;/script&gt;'), 'shown as text');
  t.true(detail.includes('&quot;&gt;&lt;img src=x onerror=alert(1)&gt;'));
  t.true((await get(`${base}/runs?type=${e(type)}`)).body.includes(run.id.slice(0, 8)), 'the hostile type is found by its filter');
  const form = (await get(`${acting}/runs/${waiting.id}`)).body;
  t.true(form.includes('Send signal'));
  t.true(form.includes('<input name="signal" value="&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img'), 'the signal name is escaped in the form');
});

test('dashboard: /events announces a change of what the page shows, and the page loads its own script only', async (t) => {
  const o = manual();
  o.registerHandler('dash.live', {}, async () => ({}));
  const run = await o.start('dash.live', {});
  const base = await serve(t, o);
  const page = await get(`${base}/runs/${run.id}`);
  t.true(page.body.includes(`<script src="/assets/live.js" data-events="/events?run=${run.id}" defer></script>`));
  t.regex(page.headers.get('content-security-policy') ?? '', /script-src 'self'/);
  const js = await get(`${base}/assets/live.js`);
  t.is(js.status, 200);
  t.regex(js.headers.get('content-type') ?? '', /javascript/);
  t.true(js.body.includes('EventSource'));

  const ac = new AbortController();
  t.teardown(() => ac.abort());
  const r = await fetch(`${base}/events?run=${run.id}`, { signal: ac.signal });
  t.regex(r.headers.get('content-type') ?? '', /text\/event-stream/);
  const reader = r.body!.getReader();
  let seen = '';
  // A read left pending when a wait times out is kept for the next wait
  // (a second read would lose what the first one receives).
  let pending: ReturnType<typeof reader.read> | null = null;
  const read = async (until: string, ms: number): Promise<boolean> => {
    const end = Date.now() + ms;
    while (Date.now() < end && !seen.includes(until)) {
      pending ??= reader.read();
      const chunk = await Promise.race([pending, new Promise<null>((res) => setTimeout(() => res(null), end - Date.now()))]);
      if (chunk === null) break;
      pending = null;
      if (chunk.done) break;
      seen += Buffer.from(chunk.value).toString('utf8');
    }
    return seen.includes(until);
  };
  t.true(await read(': live', 2000));
  t.false(await read('event: change', 1500), 'nothing changed, nothing announced');
  await o.cancel(run.id);
  t.true(await read('event: change', 3000), 'the cancel is announced');
  t.is((await get(`${base}/events?run=not-a-run`)).status, 404);
});

postgresOnly('npx jobforge dashboard serves a Postgres database read-only, and stops on SIGINT', async (t, make) => {
  const opts = make.options();
  const schema = opts.postgres!.schema!;
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  await o.migrate();
  o.registerHandler('cli.dash', {}, async () => ({}));
  const run = await o.start('cli.dash', {});
  const cli = path.join(__dirname, '..', 'bin', 'jobforge.js');
  const child = spawn(process.execPath, [cli, 'dashboard', '--url', PG_URL, '--schema', schema, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  t.teardown(() => child.kill('SIGKILL'));
  let out = '';
  let err = '';
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /at (http:\/\/\S+\/) /.exec(out);
      if (m) resolve(m[1]!);
    });
    child.on('exit', (code) => reject(new Error(`exited ${code}: ${err}`)));
  });
  t.regex(out, /read-only/);
  const list = await get(`${url}runs`);
  t.is(list.status, 200);
  t.true(list.body.includes(run.id.slice(0, 8)));
  t.is((await post(`${url}runs/${run.id}/cancel`, { csrf: 'x' })).status, 403);
  const code = await new Promise<number | null>((resolve) => {
    child.on('exit', (c) => resolve(c));
    child.kill('SIGINT');
  });
  t.is(code, 0, err);
});

postgresOnly('npx jobforge dashboard --multi-tenant shows one tenant per page, picked with ?tenant=', async (t, make) => {
  const opts = make.options({ multiTenant: true });
  const schema = opts.postgres!.schema!;
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  await o.migrate();
  o.registerHandler('cli.mt', {}, async () => ({}));
  const acme = await o.start('cli.mt', {}, { tenantId: 'acme' });
  const none = await o.start('cli.mt', {}, { tenantId: null });
  const cli = path.join(__dirname, '..', 'bin', 'jobforge.js');
  const child = spawn(process.execPath, [cli, 'dashboard', '--url', PG_URL, '--schema', schema, '--port', '0', '--multi-tenant'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.teardown(() => child.kill('SIGKILL'));
  let out = '';
  let err = '';
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /at (http:\/\/\S+\/) /.exec(out);
      if (m) resolve(m[1]!);
    });
    child.on('exit', (code) => reject(new Error(`exited ${code}: ${err}`)));
  });
  t.regex(out, /multi-tenant/);
  const acmePage = await get(`${url}runs?tenant=acme`);
  t.is(acmePage.status, 200);
  t.true(acmePage.body.includes(acme.id.slice(0, 8)));
  t.false(acmePage.body.includes(none.id.slice(0, 8)));
  const nonePage = await get(`${url}runs`);
  t.true(nonePage.body.includes(none.id.slice(0, 8)));
  t.false(nonePage.body.includes(acme.id.slice(0, 8)));
  t.is((await get(`${url}runs/${acme.id}`)).status, 404, 'another tenant’s run is not found');
  t.is((await get(`${url}runs/${acme.id}?tenant=acme`)).status, 200);
});

test('dashboard: mounted in Express with app.use(path, handler), as in a Nest main.ts', async (t) => {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const express = require('express') as () => { use: (...a: unknown[]) => void; listen: (p: number, h: string, cb: () => void) => import('node:http').Server };
  const o = manual();
  o.registerHandler('dash.x', {}, async () => ({}));
  const run = await o.start('dash.x', {});
  const app = express();
  app.use('/jobs', createDashboard(o, { basePath: '/jobs' }));
  app.use((_req: unknown, res: { status: (n: number) => { end: (s: string) => void } }) => res.status(418).end('app'));
  const server = await new Promise<import('node:http').Server>((r) => {
    const s = app.listen(0, '127.0.0.1', () => r(s));
  });
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const runs = await get(`${base}/jobs/runs`);
  t.is(runs.status, 200);
  t.true(runs.body.includes(`href="/jobs/runs/${run.id}"`));
  t.is((await get(`${base}/jobs/runs/${run.id}`)).status, 200);
  t.is((await get(`${base}/jobs/unknown-page`)).status, 418, 'what the dashboard does not serve goes on to the app (next)');
  t.is((await get(`${base}/elsewhere`)).status, 418);
});

test('dashboard: mounted in Express under a name that is one of its pages (/runs), every page is served', async (t) => {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const express = require('express') as () => { use: (...a: unknown[]) => void; listen: (p: number, h: string, cb: () => void) => import('node:http').Server };
  const o = manual();
  o.registerHandler('dash.x', {}, async () => ({}));
  const run = await o.start('dash.x', {});
  const app = express();
  app.use('/runs', createDashboard(o, { basePath: '/runs' }));
  const server = await new Promise<import('node:http').Server>((r) => {
    const s = app.listen(0, '127.0.0.1', () => r(s));
  });
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const overview = await get(`${base}/runs`);
  t.is(overview.status, 200);
  t.true(overview.body.includes('<title>Overview'), 'the mount itself is the overview');
  const runs = await get(`${base}/runs/runs`);
  t.true(runs.body.includes('<title>Runs'), 'the runs page under the mount');
  t.true(runs.body.includes(`href="/runs/runs/${run.id}"`));
  t.is((await get(`${base}/runs/runs/${run.id}`)).status, 200);
  t.is((await get(`${base}/runs/schedules`)).status, 200);
});

test('dashboard: without authorize, a loopback request by another name is refused (DNS rebinding)', async (t) => {
  const o = manual();
  const base = await serve(t, o);
  const { request } = await import('node:http');
  const status = (host: string): Promise<number> =>
    new Promise((resolve, reject) => {
      const u = new URL(base);
      const r = request({ host: u.hostname, port: u.port, path: '/', headers: { host } }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      r.on('error', reject);
      r.end();
    });
  t.is(await status(`localhost:${new URL(base).port}`), 200);
  t.is(await status('127.0.0.1'), 200);
  t.is(await status('[::1]:80'), 200);
  t.is(await status(`evil.example:${new URL(base).port}`), 403, 'a rebound name');
  t.is(await status('127.0.0.1.evil.example'), 403);
});

test('dashboard: a shared secret gives every replica the same form token; other methods and paths go to next', async (t) => {
  const o = manual();
  const a = createDashboard(o, { authorize: () => true, secret: 's3cret' });
  const b = createDashboard(o, { authorize: () => true, secret: 's3cret' });
  const c = createDashboard(o, { authorize: () => true });
  const tokenOf = async (h: ReturnType<typeof createDashboard>): Promise<string> => {
    o.registerHandler('dash.s', {}, async () => ({}));
    const run = await o.start('dash.s', {});
    const server = createServer((req, res) => h(req, res));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      return csrfOf((await get(`http://127.0.0.1:${(server.address() as AddressInfo).port}/runs/${run.id}`)).body);
    } finally {
      server.close();
    }
  };
  t.is(await tokenOf(a), await tokenOf(b));
  t.not(await tokenOf(a), await tokenOf(c));
  let passed = 0;
  const next = createServer((req, res) =>
    a(req, res, () => {
      passed++;
      res.statusCode = 418;
      res.end();
    }),
  );
  await new Promise<void>((r) => next.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => next.close(() => r())));
  const at = `http://127.0.0.1:${(next.address() as AddressInfo).port}`;
  t.is((await fetch(`${at}/api/orders`, { method: 'POST', body: '{}' })).status, 418);
  t.is((await fetch(`${at}/runs`, { method: 'DELETE' })).status, 405);
  t.is((await fetch(`${at}/events`, { method: 'HEAD' })).status, 405);
  t.is(passed, 1);
});

// ─── job type and scope filters; the signal action ─────────────────────────

/** An href as the browser follows it (the page escapes `&` in attributes). */
const hrefOf = (body: string, cls: string): string | null => {
  const m = new RegExp(`<a class="${cls}" href="([^"]+)"`).exec(body);
  return m ? m[1]!.replace(/&amp;/g, '&') : null;
};

forBackends('dashboard: runs filtered by job type and by scope, the filters kept in the paging links', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dash.a', {}, async () => ({}));
  o.registerHandler('dash.b', {}, async () => ({}));
  const acct = (entityId: string) => ({ entityType: 'acct', entityId });
  const a7 = await o.startMany(Array.from({ length: 55 }, (_, i) => ({ type: 'dash.a' as const, input: { i }, opts: { scope: acct('7') } })));
  const b7 = await o.startMany(Array.from({ length: 3 }, (_, i) => ({ type: 'dash.b' as const, input: { i }, opts: { scope: acct('7') } })));
  const a8 = await o.start('dash.a', {}, { scope: acct('8') });
  const b = await o.start('dash.b', {});
  const base = await serve(t, o);
  const short = (id: string): string => id.slice(0, 8);

  const byType = await get(`${base}/runs?type=dash.b`);
  t.is(byType.status, 200);
  for (const r of [...b7, b]) t.true(byType.body.includes(short(r.id)), 'a run of the type');
  t.false(byType.body.includes(short(a8.id)), 'another type is left out');
  t.true(byType.body.includes('<input name="type" value="dash.b">'), 'the form shows the filter');

  const byScope = await get(`${base}/runs?scopeType=acct&scopeId=8`);
  t.true(byScope.body.includes(short(a8.id)));
  t.false(byScope.body.includes(short(b.id)));
  t.false(byScope.body.includes(short(a7[0]!.id)));

  // 55 runs of dash.a in scope acct/7: two pages, the second through the link.
  const first = await get(`${base}/runs?type=dash.a&scopeType=acct&scopeId=7`);
  t.is((first.body.match(/<a class="id"/g) ?? []).length, 50);
  const next = hrefOf(first.body, 'next');
  t.truthy(next);
  const params = new URL(next!, base).searchParams;
  t.deepEqual([params.get('type'), params.get('scopeType'), params.get('scopeId')], ['dash.a', 'acct', '7'], 'the filters stay in the link');
  const second = await get(`${base}${next}`);
  t.is((second.body.match(/<a class="id"/g) ?? []).length, 5);
  t.is(hrefOf(second.body, 'next'), null);
  const listed = [first.body, second.body].join('');
  t.true(a7.every((r) => listed.includes(short(r.id))), 'every run of the type in the scope');
  t.false(listed.includes(short(b7[0]!.id)) || listed.includes(short(a8.id)));

  const half = await get(`${base}/runs?scopeType=acct`);
  t.is(half.status, 400, 'a scope needs both parts');
  t.true(half.body.includes('both its entity type and its entity id'));

  // Values typed into the form come back escaped, in the inputs and the link.
  const evil = '"><script>alert(1)</script>';
  const hostile = await get(`${base}/runs?type=${encodeURIComponent(evil)}&scopeType=${encodeURIComponent(evil)}&scopeId=x`);
  t.is(hostile.status, 200);
  t.false(hostile.body.includes('<script>alert(1)'));
  t.true(hostile.body.includes('value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"'));
  // The run page links its type and scope to these filters.
  const detail = await get(`${base}/runs/${a8.id}`);
  t.true(detail.body.includes(`href="/runs?type=dash.a"`));
  t.true(detail.body.includes(`href="/runs?scopeType=acct&amp;scopeId=8"`));
});

test('dashboard: a job-type page that examined 5,000 runs before it filled says so and links on', async (t) => {
  const o = manual();
  o.registerHandler('dash.rare', {}, async () => ({}));
  o.registerHandler('dash.common', {}, async () => ({}));
  const rare = await o.startMany([{ type: 'dash.rare', input: {} }, { type: 'dash.rare', input: {} }]);
  o.advanceTime(1);
  for (let i = 0; i < 6; i++) await o.startMany(Array.from({ length: 1000 }, () => ({ type: 'dash.common' as const, input: {} })));
  const base = await serve(t, o);
  const first = await get(`${base}/runs?type=dash.rare`);
  t.true(first.body.includes('This page looked at 5,000 runs'), 'the short page says why');
  t.false(first.body.includes('No runs match.'));
  t.false(rare.some((r) => first.body.includes(r.id.slice(0, 8))));
  const next = hrefOf(first.body, 'next');
  t.truthy(next, 'and links on');
  const second = await get(`${base}${next}`);
  t.true(rare.every((r) => second.body.includes(r.id.slice(0, 8))));
  t.is(hrefOf(second.body, 'next'), null);
});

forBackends('dashboard: a run waiting on a signal offers "Send signal" named after its wait; the signal resumes it with the JSON payload', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dash.approve', {}, async (ctx: JobContext<unknown>) => {
    const approval = await ctx.waitForSignal('approval', { signal: 'approve' });
    const note = await ctx.waitForSignal('note');
    return { approval, note };
  });
  const run = await o.start('dash.approve', {});
  const c = await o.claimNext('batch');
  await o.tick(c!.id);
  t.is((await o.getRun(run.id))?.status, 'waiting');
  const base = await serve(t, o, { authorize: () => true });
  const page = await get(`${base}/runs/${run.id}`);
  t.true(page.body.includes('Send signal'));
  t.true(page.body.includes('<input name="signal" value="approve"'), 'the name it waits on, prefilled');
  t.true(page.body.includes('signal &#39;approve&#39;'), 'what it waits on');
  const csrf = csrfOf(page.body);
  const url = `${base}/runs/${run.id}/signal`;

  const bad = await post(url, { csrf, signal: 'approve', payload: '{"ok": tru' }, { origin: base });
  t.is(bad.status, 400);
  t.regex(await bad.text(), /the payload is not JSON/);
  const nameless = await post(url, { csrf, signal: '', payload: '' }, { origin: base });
  t.is(nameless.status, 400);
  t.is((await o.getRun(run.id))?.status, 'waiting', 'a refused signal changed nothing');

  const sent = await post(url, { csrf, signal: 'approve', payload: '{"ok": true, "by": "ops"}' }, { origin: base });
  t.is(sent.status, 303);
  t.is(sent.headers.get('location'), `/runs/${run.id}?signal=delivered`);
  t.is((await o.getRun(run.id))?.status, 'pending', 'the wait took it: the run resumes');
  t.true((await get(`${base}${sent.headers.get('location')}`)).body.includes('The signal was delivered'));
  const c2 = await o.claimNext('batch');
  await o.tick(c2!.id);
  const next = await get(`${base}/runs/${run.id}`);
  t.true(next.body.includes('<input name="signal" value="note"'), 'the next wait names the form');
  // A name no wait asks for goes to the inbox; then the awaited one with no payload is null.
  const inbox = await post(url, { csrf, signal: 'later', payload: '[1]' }, { origin: base });
  t.is(inbox.headers.get('location'), `/runs/${run.id}?signal=inbox`);
  t.is((await o.getRun(run.id))?.status, 'waiting');
  t.is((await post(url, { csrf, signal: 'note', payload: '  ' }, { origin: base })).status, 303);
  const c3 = await o.claimNext('batch');
  await o.tick(c3!.id);
  const done = await o.getRun(run.id);
  t.is(done?.status, 'completed');
  t.deepEqual(done?.output, { approval: { ok: true, by: 'ops' }, note: null });
  const ended = await get(`${base}/runs/${run.id}`);
  t.false(ended.body.includes('Send signal'), 'no signal form on an ended run');
  t.is((await post(url, { csrf, signal: 'note', payload: '' }, { origin: base })).status, 409, 'a run that ended takes no signal');
});

test('dashboard: the signal action needs its token, the same origin and authorize(req, \'signal\')', async (t) => {
  const o = manual({ multiTenant: true });
  o.registerHandler('dash.sig', {}, async (ctx: JobContext<unknown>) => ({ got: await ctx.waitForSignal('go') }));
  o.registerHandler('dash.tok', {}, async (ctx: JobContext<unknown>) => ({ got: await ctx.waitForToken('t', () => undefined) }));
  const run = await o.start('dash.sig', {}, { tenantId: 'a' });
  const theirs = await o.start('dash.sig', {}, { tenantId: 'b' });
  const tok = await o.start('dash.tok', {}, { tenantId: 'a' });
  for (let i = 0; i < 3; i++) {
    const c = await o.claimNext('batch');
    await o.tick(c!.id);
  }
  const asked: string[] = [];
  const base = await serve(t, o, {
    authorize: (req, action) => {
      asked.push(action);
      if (action === 'signal' && req.headers['x-user'] === 'viewer') return false;
      return { tenantId: 'a' };
    },
  });
  const page = await get(`${base}/runs/${run.id}`);
  const csrf = csrfOf(page.body);
  const url = `${base}/runs/${run.id}/signal`;
  const form = { csrf, signal: 'go', payload: '1' };
  t.is((await post(url, { ...form, csrf: 'forged' }, { origin: base })).status, 403, 'a wrong token');
  t.is((await post(url, { signal: 'go', payload: '1' }, { origin: base })).status, 403, 'no token');
  t.is((await post(url, form)).status, 403, 'no Origin nor Referer');
  t.is((await post(url, form, { origin: 'https://evil.example' })).status, 403, 'another origin');
  t.is((await post(url, form, { origin: base, 'x-user': 'viewer' })).status, 403, 'authorize said no to signal');
  t.is((await fetch(url)).status, 405, 'GET is no action');
  t.is((await post(`${base}/runs/${theirs.id}/signal`, form, { origin: base })).status, 404, 'another tenant\'s run');
  t.is((await o.getRun(run.id, 'a'))?.status, 'waiting', 'nothing refused changed the run');
  t.is((await o.getRun(theirs.id, 'b'))?.status, 'waiting');
  t.true(asked.includes('signal'));
  t.is((await post(url, form, { referer: `${base}/runs/${run.id}` })).status, 303);
  t.is((await o.getRun(run.id, 'a'))?.status, 'pending');

  const tokenPage = await get(`${base}/runs/${tok.id}`);
  t.true(tokenPage.body.includes('Resume with its token'), 'a token wait offers the resume form');
  t.false(tokenPage.body.includes('Send signal'));

  // Read-only (no authorize): no form, and the action is refused.
  const ro = await serve(t, o);
  t.false((await get(`${ro}/runs/${theirs.id}?tenant=b`)).body.includes('Send signal'));
  const refused = await post(`${ro}/runs/${theirs.id}/signal?tenant=b`, form, { origin: ro });
  t.is(refused.status, 403);
  t.regex(await refused.text(), /read-only/, 'refused as read-only (before its form token is looked at)');
  t.is((await o.getRun(theirs.id, 'b'))?.status, 'waiting');
});

forBackends('dashboard: a run waiting on a token is resumed from its page with the pasted token and a JSON payload; a wrong, used or other tenant\'s token changes nothing', async (t, make) => {
  const o = await make({ multiTenant: true });
  const tokens = new Map<string, string>();
  o.registerHandler('dash.tok', {}, async (ctx: JobContext<unknown>) => ({
    got: await ctx.waitForToken('approval', (token) => void tokens.set(ctx.run.id, token)),
  }));
  const mine = await o.start('dash.tok', {}, { tenantId: 'a' });
  const theirs = await o.start('dash.tok', {}, { tenantId: 'b' });
  const sibling = await o.start('dash.tok', {}, { tenantId: 'a' });
  for (let i = 0; i < 3; i++) {
    const c = await o.claimNext('batch');
    await o.tick(c!.id);
  }
  t.is((await o.getRun(mine.id, 'a'))?.status, 'waiting');
  const asked: string[] = [];
  const base = await serve(t, o, {
    authorize: (req, action) => {
      asked.push(action);
      if (action === 'resume' && req.headers['x-user'] === 'viewer') return false;
      return { tenantId: 'a' };
    },
  });
  const page = await get(`${base}/runs/${mine.id}`);
  t.true(page.body.includes('Resume with its token'));
  t.true(page.body.includes('<button type="submit" class="act act-resume">Resume</button>'));
  const csrf = csrfOf(page.body);
  const url = `${base}/runs/${mine.id}/resume`;
  const token = tokens.get(mine.id)!;
  const form = { csrf, token, payload: '{"approved": true}' };
  t.is((await post(url, { ...form, csrf: 'forged' }, { origin: base })).status, 403, 'a wrong form token');
  t.is((await post(url, form, { origin: 'https://evil.example' })).status, 403, 'another origin');
  t.is((await post(url, form, { origin: base, 'x-user': 'viewer' })).status, 403, 'authorize said no to resume');
  t.is((await post(url, { csrf, token: '  ', payload: '' }, { origin: base })).status, 400, 'no token');
  t.is((await post(url, { ...form, payload: '{nope' }, { origin: base })).status, 400, 'a payload that is not JSON');
  const wrong = await post(url, { ...form, token: `${token.slice(0, -4)}0000` }, { origin: base });
  t.is(wrong.status, 400, 'a token that is not the wait\'s');
  const why = await wrong.text();
  t.true(why.includes('resume token refused'), why);
  // Pinned to tenant a: tenant b's token is refused, its run left waiting.
  t.is((await post(url, { ...form, token: tokens.get(theirs.id)! }, { origin: base })).status, 400, 'another tenant\'s token');
  t.is((await o.getRun(theirs.id, 'b'))?.status, 'waiting');
  // Authorize saw this page's run: another run's token (of the same tenant) is refused here.
  t.is((await post(url, { ...form, token: tokens.get(sibling.id)! }, { origin: base })).status, 400, 'another run\'s token');
  t.is((await o.getRun(sibling.id, 'a'))?.status, 'waiting');
  t.is((await o.getRun(mine.id, 'a'))?.status, 'waiting', 'nothing refused changed the run');
  t.true(asked.includes('resume'));

  const ok = await post(url, { ...form, token: `  ${token}\n` }, { origin: base });
  t.is(ok.status, 303);
  t.is(ok.headers.get('location'), `/runs/${mine.id}?resumed=1&tenant=a`);
  t.true((await get(`${base}${ok.headers.get('location')}`)).body.includes('The token was taken'));
  t.is((await o.getRun(mine.id, 'a'))?.status, 'pending');
  t.is((await post(url, form, { origin: base })).status, 400, 'a used token');
  const c = await o.claimNext('batch');
  await o.tick(c!.id);
  const done = await o.getRun(mine.id, 'a');
  t.is(done?.status, 'completed');
  t.deepEqual(done?.output, { got: { approved: true } });
  t.false((await get(`${base}/runs/${mine.id}`)).body.includes('Resume with its token'), 'no form once the run ended');

  // Read-only (no authorize): a note instead of the form, and the action is refused.
  const ro = await serve(t, o);
  const roPage = await get(`${ro}/runs/${theirs.id}?tenant=b`);
  t.false(roPage.body.includes('Resume with its token'));
  t.true(roPage.body.includes('whoever holds it calls'));
  const refused = await post(`${ro}/runs/${theirs.id}/resume?tenant=b`, { csrf, token: tokens.get(theirs.id)!, payload: '' }, { origin: ro });
  t.is(refused.status, 403);
  t.regex(await refused.text(), /read-only/, 'refused as read-only (before its form token is looked at)');
  t.is((await o.getRun(theirs.id, 'b'))?.status, 'waiting');
});
