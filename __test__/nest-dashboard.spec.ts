/**
 * `JobsModule.forRoot({ dashboard: { path, authorize? } })` (issue 25): the
 * dashboard mounted in a real Nest application on the Express platform
 * (its default body parser on), beside the app's own routes; POST actions
 * through Nest; read-only and loopback-only without `authorize`; the
 * option checked; `forRootAsync` mounts it too.
 */
import 'reflect-metadata';
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { Module, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { JOB_ORCHESTRATOR, JobInputInvalidError, JobsModule, type JobsModuleOptions } from '../dist/nest';
import type { JobOrchestrator } from '../dist';

async function app(t: ExecutionContext, jobs: ReturnType<typeof JobsModule.forRoot>): Promise<{ base: string; o: JobOrchestrator }> {
  @Module({ imports: [jobs] })
  class AppModule {}
  const a: INestApplication = await NestFactory.create(AppModule, { logger: false });
  t.teardown(() => a.close());
  // A route of the app's own (a controller's, as Express sees it).
  a.getHttpAdapter().get('/hello', (_req: unknown, res: { send(s: string): void }) => res.send('app route'));
  await a.listen(0, '127.0.0.1');
  const addr = a.getHttpServer().address() as { port: number };
  const o = a.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  o.registerHandler('nd.slow', {}, () => new Promise(() => undefined));
  return { base: `http://127.0.0.1:${addr.port}`, o };
}

const csrfOf = (page: string): string => /name="csrf" value="([^"]+)"/.exec(page)?.[1] ?? '';

function post(url: string, form: Record<string, string>, origin: string): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', origin },
    body: new URLSearchParams(form).toString(),
  });
}

const base: JobsModuleOptions = { worker: false, clock: 'manual' };

test('nest dashboard: pages under the path, the app’s routes beside it, a cancel POSTed through Nest’s body parser', async (t) => {
  const seen: string[] = [];
  const { base: url, o } = await app(
    t,
    JobsModule.forRoot({
      ...base,
      dashboard: {
        path: '/admin/jobs',
        authorize: (req, action) => {
          seen.push(action);
          return req.headers['x-user'] !== 'mallory';
        },
      },
    }),
  );
  const run = await o.start('nd.slow', {});
  const overview = await fetch(`${url}/admin/jobs`);
  t.is(overview.status, 200);
  t.regex(await overview.text(), /href="\/admin\/jobs\/runs/, 'links are built under the mount path');
  t.is(await (await fetch(`${url}/hello`)).text(), 'app route', 'the app’s own routes still answer');
  t.is((await fetch(`${url}/nowhere`)).status, 404, 'Nest’s not-found handler still answers the rest');
  const page = await fetch(`${url}/admin/jobs/runs/${run.id}`);
  t.is(page.status, 200);
  const csrf = csrfOf(await page.text());
  t.true(csrf.length > 20, 'the run page of a live run offers its actions');
  t.is((await post(`${url}/admin/jobs/runs/${run.id}/cancel`, { csrf: 'forged' }, url)).status, 403, 'a wrong token');
  const done = await post(`${url}/admin/jobs/runs/${run.id}/cancel`, { csrf }, url);
  t.is(done.status, 303, await done.text());
  t.is((await o.getRun(run.id))?.status, 'canceled');
  t.true(seen.includes('cancel'));
});

test('nest dashboard: without authorize it answers loopback reads and refuses actions', async (t) => {
  const { base: url, o } = await app(t, JobsModule.forRoot({ ...base, dashboard: { path: '/jobs/' } }));
  const run = await o.start('nd.slow', {});
  const page = await fetch(`${url}/jobs/runs/${run.id}`);
  t.is(page.status, 200);
  t.regex(await page.text(), /Read-only/);
  const refused = await post(`${url}/jobs/runs/${run.id}/cancel`, { csrf: 'x' }, url);
  t.is(refused.status, 403);
  t.regex(await refused.text(), /read-only/, 'refused as read-only (before its form token is looked at)');
  t.is((await o.getRun(run.id))?.status, 'pending');
});

test('nest dashboard: forRootAsync mounts it from the factory’s options', async (t) => {
  const { base: url } = await app(t, JobsModule.forRootAsync({ useFactory: () => ({ ...base, dashboard: { path: '/ops', title: 'ops <jobs>' } }) }));
  const page = await fetch(`${url}/ops/schedules`);
  t.is(page.status, 200);
  t.regex(await page.text(), /ops &lt;jobs&gt;/);
});

test('nest dashboard: a bad option is a typed error at forRoot, and at init from forRootAsync', async (t) => {
  const bad: unknown[] = [
    { path: 'jobs' },
    { path: '/' },
    { path: '/jobs?x' },
    { path: 42 },
    { path: '/jobs', authorize: 'yes' },
    { path: '/jobs', secret: '' },
    { path: '/jobs', mount: true },
    null,
    'jobs',
  ];
  for (const d of bad) {
    t.throws(() => JobsModule.forRoot({ ...base, dashboard: d as never }), { instanceOf: JobInputInvalidError }, JSON.stringify(d));
  }
  @Module({ imports: [JobsModule.forRootAsync({ useFactory: () => ({ ...base, dashboard: { path: 'jobs' } }) })] })
  class AsyncBad {}
  const a = await NestFactory.create(AsyncBad, { logger: false, abortOnError: false });
  await t.throwsAsync(() => a.init(), { instanceOf: JobInputInvalidError, message: /dashboard\.path/ });
  await a.close().catch(() => undefined);
});
