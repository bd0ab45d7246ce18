// `@JobHandler` / `HandlerRegistry` of `jobforge/nest`: the error for a
// handler that is not a provider, duplicate types per NODE_ENV, scoped
// handler providers, and the core package loading without Nest at all.
//
// Serial: the registry is process-wide and NODE_ENV / Nest's logger are
// global, so these tests run one at a time, in this order.
// (Decorators here are TC39 ones under tsx; see nest.spec.ts for why
// constructor dependencies use `@InjectArgs`.)
import 'reflect-metadata';
import test from 'ava';
import { execFile, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Inject, Injectable, Logger, Scope, type LoggerService } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DuplicateJobHandlerError,
  HandlerRegistry,
  JOB_ORCHESTRATOR,
  JobHandler,
  JobHandlerBase,
  JobHandlerNotProviderError,
  JobforgeError,
  JobsModule,
  getJobHandlerMetadata,
} from '../dist/nest';
import type { JobContext, JobOrchestrator } from '../dist/nest';

function InjectArgs(...tokens: (symbol | string | (abstract new (...a: never[]) => unknown))[]) {
  return (cls: object): void => tokens.forEach((token, i) => Inject(token as symbol)(cls, undefined, i));
}

class CaptureLogger implements LoggerService {
  readonly lines: { level: string; message: unknown }[] = [];
  log(message: unknown) {
    this.lines.push({ level: 'log', message });
  }
  warn(message: unknown) {
    this.lines.push({ level: 'warn', message });
  }
  error(message: unknown) {
    this.lines.push({ level: 'error', message });
  }
}

@Injectable()
class Ledger {
  readonly entries: string[] = [];
}

@JobHandler('reg.orphan', { retry: { attempts: 1, backoff: 'fixed', baseMs: 0 } })
@InjectArgs(Ledger)
class OrphanHandler extends JobHandlerBase<{ n: number }> {
  constructor(private readonly ledger: Ledger) {
    super();
  }
  async run(ctx: JobContext<{ n: number }>) {
    this.ledger.entries.push(`orphan ${ctx.input.n}`);
    return { n: ctx.input.n };
  }
}

let transientBuilt = 0;

@JobHandler('reg.transient')
@Injectable({ scope: Scope.TRANSIENT })
class TransientHandler extends JobHandlerBase {
  readonly serial = ++transientBuilt;
  async run() {
    return { serial: this.serial };
  }
}

const ENV = process.env.NODE_ENV;
test.afterEach.always(() => {
  process.env.NODE_ENV = ENV;
});

test.serial('a handler class that is not a provider fails init with the class name and the fix', async (t) => {
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ worker: false })],
    providers: [Ledger, TransientHandler], // OrphanHandler missing
  })
    .setLogger(new CaptureLogger())
    .compile();
  const err = await t.throwsAsync(() => mod.init(), { instanceOf: JobHandlerNotProviderError });
  t.true(err instanceof JobforgeError, 'one instanceof catches the Nest errors too');
  t.is(err?.handlerClass, 'OrphanHandler');
  t.is(err?.jobType, 'reg.orphan');
  t.regex(err!.message, /OrphanHandler/);
  t.regex(err!.message, /providers: \[OrphanHandler\]/);
  await mod.close().catch(() => undefined);
});

test.serial('with the class listed in providers the same handler runs, its dependency injected', async (t) => {
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ worker: { pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 500 } })],
    providers: [Ledger, OrphanHandler, TransientHandler],
  })
    .setLogger(new CaptureLogger())
    .compile();
  await mod.init();
  t.teardown(() => mod.close());
  const jobs = mod.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  const run = await jobs.start('reg.orphan', { n: 3 });
  t.is((await jobs.waitForRun(run.id, { timeoutMs: 5000 })).status, 'completed');
  t.deepEqual(mod.get(Ledger).entries, ['orphan 3']);
});

test.serial('a transient-scoped handler gets a fresh instance per execution', async (t) => {
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ worker: { pools: { batch: { concurrency: 1 } } } })],
    providers: [Ledger, OrphanHandler, TransientHandler],
  })
    .setLogger(new CaptureLogger())
    .compile();
  await mod.init();
  t.teardown(() => mod.close());
  const jobs = mod.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  const serials: unknown[] = [];
  for (let i = 0; i < 2; i++) {
    const run = await jobs.start('reg.transient', {});
    const done = await jobs.waitForRun(run.id, { timeoutMs: 5000 });
    t.is(done.status, 'completed');
    serials.push(done.output?.serial);
  }
  t.not(serials[0], serials[1]);
  t.is(Reflect.getMetadata('scope:options', TransientHandler)?.scope, Scope.TRANSIENT, '@JobHandler kept the scope');
});

test.serial('the decorator records metadata, makes the class injectable and fills the registry', (t) => {
  t.deepEqual(getJobHandlerMetadata(OrphanHandler)?.type, 'reg.orphan');
  t.is(getJobHandlerMetadata(OrphanHandler)?.meta.retry?.attempts, 1);
  t.is(getJobHandlerMetadata(class {}), undefined);
  t.true(Reflect.getMetadata('__injectable__', OrphanHandler));
  t.is(HandlerRegistry.get('reg.orphan')?.handlerClass, OrphanHandler);
  t.is(new HandlerRegistry().get('reg.transient')?.handlerClass, TransientHandler);
  t.deepEqual(
    HandlerRegistry.getAll()
      .map((d) => d.type)
      .filter((x) => x.startsWith('reg.')),
    ['reg.orphan', 'reg.transient'],
  );
  t.throws(() => JobHandler('reg.norun')(class NoRun {} as never), { instanceOf: TypeError, message: /NoRun needs a run\(ctx\)/ });
  t.throws(() => JobHandler(''), { instanceOf: TypeError });
  t.is(HandlerRegistry.get('reg.norun'), undefined);
});

test.serial('a duplicate job type throws in production, warns in development, is silent in test', (t) => {
  const capture = new CaptureLogger();
  Logger.overrideLogger(capture);
  t.teardown(() => Logger.overrideLogger(new CaptureLogger()));
  const make = (name: string) =>
    ({
      [name]: class {
        async run() {
          return {};
        }
      },
    })[name]!;

  // production: the second class is rejected, the first stays.
  process.env.NODE_ENV = 'production';
  const P1 = make('ProdOne');
  const P2 = make('ProdTwo');
  JobHandler('dup.prod')(P1);
  const err = t.throws(() => JobHandler('dup.prod')(P2), { instanceOf: DuplicateJobHandlerError });
  t.true(err instanceof JobforgeError);
  t.regex(err!.message, /ProdOne and ProdTwo/);
  t.is(HandlerRegistry.get('dup.prod')?.handlerClass, P1);
  // Re-decorating the same class is not a duplicate.
  t.notThrows(() => JobHandler('dup.prod')(P1));

  // development (and unset): a warning naming both classes; the later class wins.
  for (const env of ['development', undefined]) {
    capture.lines.length = 0;
    if (env === undefined) delete process.env.NODE_ENV;
    else process.env.NODE_ENV = env;
    const D1 = make('DevOne');
    const D2 = make('DevTwo');
    JobHandler(`dup.dev.${env}`)(D1);
    t.notThrows(() => JobHandler(`dup.dev.${env}`)(D2));
    t.is(HandlerRegistry.get(`dup.dev.${env}`)?.handlerClass, D2);
    const warns = capture.lines.filter((l) => l.level === 'warn');
    t.is(warns.length, 1, `NODE_ENV=${env}`);
    t.regex(String(warns[0]?.message), /DevOne and DevTwo/);
  }

  // test: silent; the later class wins.
  capture.lines.length = 0;
  process.env.NODE_ENV = 'test';
  const T1 = make('TestOne');
  const T2 = make('TestTwo');
  JobHandler('dup.test')(T1);
  t.notThrows(() => JobHandler('dup.test')(T2));
  t.is(HandlerRegistry.get('dup.test')?.handlerClass, T2);
  t.deepEqual(capture.lines, []);
});

test.serial('the core entry point loads and runs without any Nest package; jobforge/nest needs them', async (t) => {
  const root = path.resolve(__dirname, '..');
  const script = `
    const Module = require('module');
    const resolve = Module._resolveFilename;
    Module._resolveFilename = function (req, ...rest) {
      if (/^(@nestjs\\/|reflect-metadata|rxjs)/.test(req)) throw new Error('blocked ' + req);
      return resolve.call(this, req, ...rest);
    };
    (async () => {
      const { JobOrchestrator } = require(${JSON.stringify(path.join(root, 'dist'))});
      const o = new JobOrchestrator();
      o.registerHandler('plain', {}, async (ctx) => ({ doubled: ctx.input.n * 2 }));
      const w = o.startWorker({ pools: { batch: { concurrency: 1 } } });
      const run = await o.start('plain', { n: 21 });
      const done = await o.waitForRun(run.id, { timeoutMs: 5000 });
      await w.stop();
      let nest = 'loaded';
      try { require(${JSON.stringify(path.join(root, 'dist', 'nest'))}); } catch (e) { nest = e.message; }
      const loadedNest = Object.keys(require.cache).some((f) => f.includes('@nestjs'));
      console.log(JSON.stringify({ status: done.status, output: done.output, nest, loadedNest }));
    })();
  `;
  const out = await new Promise<string>((resolve, reject) =>
    execFile(process.execPath, ['-e', script], { timeout: 20_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
    ),
  );
  const r = JSON.parse(out.trim().split('\n').pop()!);
  t.is(r.status, 'completed');
  t.deepEqual(r.output, { doubled: 42 });
  t.false(r.loadedNest);
  t.regex(r.nest, /^blocked (reflect-metadata|@nestjs\/)/);
});

// A Nest app generated by the classic Nest CLI compiles with `"module":
// "commonjs"` and no `moduleResolution` (node10), which ignores the
// package's `exports` map: `jobforge/nest` must still type-check there.
test('jobforge and jobforge/nest type-check under node10 module resolution (classic Nest CLI tsconfig)', (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'jobforge-node10-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.mkdirSync(path.join(dir, 'node_modules'));
  fs.symlinkSync(path.resolve(__dirname, '..'), path.join(dir, 'node_modules', 'jobforge'), 'dir');
  fs.writeFileSync(
    path.join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        module: 'commonjs',
        target: 'es2021',
        strict: true,
        noEmit: true,
        experimentalDecorators: true,
        emitDecoratorMetadata: true,
        // A Nest app has @types/node (Nest's own declarations need it).
        typeRoots: [path.resolve(__dirname, '..', 'node_modules', '@types')],
        types: ['node'],
      },
      files: ['app.ts'],
    }),
  );
  fs.writeFileSync(
    path.join(dir, 'app.ts'),
    [
      "import { JobOrchestrator } from 'jobforge';",
      "import { JobsModule, JobHandler, JobHandlerBase, JobStoreError } from 'jobforge/nest';",
      "import type { JobContext, IJobOrchestrator } from 'jobforge/nest';",
      "@JobHandler('x.y')",
      'export class H extends JobHandlerBase<{ n: number }> {',
      '  async run(ctx: JobContext<{ n: number }>) { return { n: ctx.input.n }; }',
      '}',
      'export const mod = JobsModule.forRoot({ worker: false });',
      'export const o: IJobOrchestrator = new JobOrchestrator();',
      'export const e = new JobStoreError("m", true);',
      '',
    ].join('\n'),
  );
  const tsc = require.resolve('typescript/bin/tsc');
  const res = spawnSync(process.execPath, [tsc, '-p', dir], { encoding: 'utf8', timeout: 60_000 });
  t.is(res.status, 0, `${res.stdout}${res.stderr}`);
});
