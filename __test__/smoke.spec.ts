import test from 'ava';
import { JobOrchestrator } from '../dist';

test('a run completes through claimNext + tick', async (t) => {
  const o = new JobOrchestrator();
  o.registerHandler('noop', {}, async () => ({ done: true }));
  const run = await o.start('noop', { a: 1 });
  const claimed = await o.claimNext('batch');
  t.is(claimed?.id, run.id);
  await o.tick(run.id);
  const after = await o.findById(run.id);
  t.is(after?.status, 'completed');
  t.deepEqual(after?.output, { done: true });
});

test("the package's runtime exports: the orchestrator, the handler helpers and every error class, nothing internal", (t) => {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const pkg = require('../dist') as Record<string, unknown>;
  t.deepEqual(Object.keys(pkg).sort(), [
    'JobChildFailedError',
    'JobClockError',
    'JobCollisionError',
    'JobHandlerBase',
    'JobInputInvalidError',
    'JobKeyFunctionUnavailableError',
    'JobNotReplayableError',
    'JobOrchestrator',
    'JobResumeTokenError',
    'JobRunNotFoundError',
    'JobRunStateError',
    'JobStepConflictError',
    'JobStepTimeoutError',
    'JobStoreError',
    'JobTemplateFieldMissingError',
    'JobTypeNotFoundError',
    'JobWaitTimeoutError',
    'JobWorkerStateError',
    'JobforgeError',
    'MissingTenantIdError',
    'ParentClosePolicy',
    'ParentRunNotFoundError',
    'consoleLogger',
    'createDashboard',
    'isLocalRequest',
  ]);
  for (const [name, value] of Object.entries(pkg)) {
    if (name.endsWith('Error')) t.true((value as { prototype: unknown }).prototype instanceof Error, name);
  }
});

test('`npm run demo` (node examples/demo.js) exits 0 in time and shows a sleep, a signal, a token and a fan-out on the worker', async (t) => {
  const { execFile } = await import('node:child_process');
  const path = await import('node:path');
  const root = path.join(__dirname, '..');
  const began = Date.now();
  const { code, stdout, stderr } = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    execFile(process.execPath, [path.join(root, 'examples', 'demo.js')], { cwd: root, timeout: 30_000, encoding: 'utf8' }, (err, out, errOut) => {
      resolve({ code: err ? ((err as { code?: unknown }).code as number | null) ?? -1 : 0, stdout: out, stderr: errOut });
    });
  });
  const took = Date.now() - began;
  t.is(code, 0, `exit code; stderr: ${stderr}`);
  t.true(took < 20_000, `the demo took ${took} ms`);
  // Part one still prints its report.
  t.regex(stdout, /^jobforge demo \(in-memory store\)/);
  t.regex(stdout, /what happened to each run:/);
  // Part two: durable waits.
  t.regex(stdout, /durable waits \(worker, pool "trips" with one slot\):/);
  t.regex(stdout, /trip: {2}waiting \(waitKind=sleep\) attempts=0, resumes by \+\d+ ms/, 'the sleep');
  t.regex(stdout, /trip: {2}waiting \(waitKind=child\) attempts=0, children:( \w+){3}/, 'the fan-out of three children');
  t.regex(stdout, /the manager opened https:\/\/example\.test\/approve\/jft_[0-9a-f]+… → resume\(\) resumed the trip/, 'the token');
  t.regex(stdout, /the bank sent signal 'payment' → delivered=true/, 'the signal');
  t.regex(stdout, /quote: signal 'accept' sent before it ran → delivered=false/, 'the inbox');
  t.regex(stdout, /trip: {2}output \{"bookings":\["flight@Lisbon","hotel@Lisbon","car@Lisbon"\],"approvedBy":"manager","paid":1290\}/, 'the fan-in and the answers');
  t.regex(stdout, /trip steps: cool-off\(wait\):completed book-flight\(wait\):completed book-hotel\(wait\):completed book-car\(wait\):completed approval\(wait\):completed payment\(wait\):completed/);
  t.regex(stdout, /quote: completed output \{"accepted":\{"price":420\},"counterOffer":"none within 100 ms"\}/, 'the timed-out second wait');
});
