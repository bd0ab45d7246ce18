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
