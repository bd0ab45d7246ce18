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
