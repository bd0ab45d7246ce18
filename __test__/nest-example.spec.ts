// examples/nest-app, as a user runs it: a child process (tsx, the example's
// own tsconfig) listening on an ephemeral loopback port, driven over HTTP.
// The last test sends SIGTERM while a run is in flight: the app drains the
// worker, prints where every run ended, and the process exits by itself.
import test from 'ava';
import { spawn, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';

const ROOT = path.resolve(__dirname, '..');
const APP = path.join(ROOT, 'examples', 'nest-app');

interface StepView {
  stepId: string;
  seq: number;
  status: string;
  attempts: number;
  output: Record<string, unknown> | null;
}
interface RunView {
  id: string;
  jobType: string;
  status: string;
  waitKind: string | null;
  attempts: number;
  parentRunId: string | null;
  scope: string | null;
  output: Record<string, unknown> | null;
  error: string | null;
}
interface StatusView {
  run: RunView;
  steps: StepView[];
  children: { run: RunView; steps: StepView[] }[];
}

let child: ChildProcess;
let baseUrl: string;
let stdout = '';
let stderr = '';
let onExit!: (e: { code: number | null; signal: NodeJS.Signals | null }) => void;
const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => (onExit = r));

test.before(async () => {
  child = spawn(process.execPath, ['--import', 'tsx', path.join(APP, 'src', 'main.ts')], {
    cwd: ROOT,
    env: {
      ...process.env,
      PORT: '0',
      HOST: '127.0.0.1',
      NO_COLOR: '1',
      TSX_TSCONFIG_PATH: path.join(APP, 'tsconfig.json'),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.on('exit', (code, signal) => onExit({ code, signal }));
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  baseUrl = await new Promise<string>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`the example did not start:\n${stdout}\n${stderr}`)), 30_000);
    const look = () => {
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout);
      if (m) {
        clearTimeout(timer);
        ok(m[1]!);
      }
    };
    child.stdout!.on('data', look);
    child.on('exit', () => fail(new Error(`the example exited early:\n${stdout}\n${stderr}`)));
  });
});

test.after.always(() => {
  if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
});

async function post(pathname: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(baseUrl + pathname, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

async function get<T>(pathname: string): Promise<{ status: number; json: T }> {
  const res = await fetch(baseUrl + pathname);
  return { status: res.status, json: (await res.json()) as T };
}

/** Polls GET /jobs/:id until `done` holds (or fails after 10 s with the last view). */
async function until(runId: string, done: (v: StatusView) => boolean): Promise<StatusView> {
  const deadline = Date.now() + 10_000;
  let last: StatusView | undefined;
  while (Date.now() < deadline) {
    const r = await get<StatusView>(`/jobs/${runId}`);
    if (r.status === 200) {
      last = r.json;
      if (done(last)) return last;
    }
    await new Promise((res) => setTimeout(res, 20));
  }
  throw new Error(`run ${runId} did not get there: ${JSON.stringify(last)}`);
}

const TERMINAL = new Set(['completed', 'failed', 'timed_out', 'canceled']);

test.serial('POST /orders enqueues a job; GET /jobs/:id shows it ran with its steps and child', async (t) => {
  const placed = await post('/orders', { orderId: 'o-1', sku: 'sku-book', qty: 2, email: 'ada@example.com' });
  t.is(placed.status, 202);
  const runId = placed.json.runId as string;
  t.regex(runId, /^[0-9a-f-]{36}$/);

  const v = await until(
    runId,
    (x) => x.run.status === 'completed' && x.children.length === 1 && x.children[0]!.run.status === 'completed',
  );
  t.is(v.run.jobType, 'order.fulfil');
  t.is(v.run.scope, 'order:o-1');
  t.deepEqual(
    v.steps.map((s) => [s.seq, s.stepId, s.status, s.attempts]),
    [
      [1, 'reserve-stock', 'completed', 1],
      [2, 'charge-payment', 'completed', 1],
    ],
  );
  t.is(v.steps[0]!.output?.left, 8);
  t.is(v.steps[1]!.output?.chargeId, 'ch-o-1-2500');
  const notify = v.children[0]!;
  t.is(notify.run.jobType, 'order.notify');
  t.is(notify.run.parentRunId, runId);
  t.is(v.run.output?.notifyRunId, notify.run.id);
  t.deepEqual(
    notify.steps.map((s) => [s.stepId, s.status]),
    [['send-email', 'completed']],
  );
  t.deepEqual(notify.run.output, { messageId: 'msg-1' });

  const scoped = await get<RunView[]>('/orders/o-1/jobs');
  t.deepEqual(
    scoped.json.map((r) => r.id),
    [runId],
  );
  t.is((await get('/jobs/00000000-0000-4000-8000-000000000000')).status, 404);
  // The handler's ctx.logger is a Nest Logger named after the run.
  t.regex(stdout, new RegExp(`\\[JobRun:${runId}\\] order o-1 charged`));
});

test.serial('a second order for an in-flight order is a 409; a failing job retries then fails', async (t) => {
  const first = await post('/orders', { orderId: 'o-2', sku: 'sku-book', qty: 1, email: 'b@example.com', paymentLatencyMs: 300 });
  t.is(first.status, 202);
  const again = await post('/orders', { orderId: 'o-2', sku: 'sku-book', qty: 1, email: 'b@example.com' });
  t.is(again.status, 409);
  t.regex(String(again.json.message), new RegExp(first.json.runId as string));
  t.is((await until(first.json.runId as string, (x) => x.run.status === 'completed')).run.status, 'completed');

  const bad = await post('/orders', { orderId: 'o-3', sku: 'sku-lamp', qty: 5, email: 'c@example.com' });
  const v = await until(bad.json.runId as string, (x) => TERMINAL.has(x.run.status));
  t.is(v.run.status, 'failed');
  t.is(v.run.attempts, 3);
  t.is(v.run.error, 'only 2 of sku-lamp left');
  t.deepEqual(
    v.steps.map((s) => [s.stepId, s.status, s.attempts]),
    [['reserve-stock', 'failed', 3]],
  );
  t.deepEqual(v.children, []);
});

/** Polls the app's stdout until `re` matches (or fails after 10 s). */
async function logged(re: RegExp): Promise<RegExpExecArray> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const m = re.exec(stdout);
    if (m) return m;
    if (Date.now() > deadline) throw new Error(`not logged: ${re}\n${stdout}`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

test.serial('an approval: the run waits on a token; POST /approvals/:token resumes it and it completes', async (t) => {
  const submitted = await post('/expenses', { expenseId: 'e-1', amountCents: 4_200, approver: 'boss@example.com' });
  t.is(submitted.status, 202);
  const runId = submitted.json.runId as string;

  const parked = await until(runId, (x) => x.run.status === 'waiting');
  t.is(parked.run.waitKind, 'token');
  t.is(parked.run.attempts, 0);
  t.deepEqual(
    parked.steps.map((s) => [s.stepId, s.status]),
    [['manager-approval', 'running']],
  );
  // The link the handler "mailed" (the example logs it).
  const linkLine = new RegExp(`approval link for run ${runId} sent to boss@example\\.com: POST /approvals/(jft_[0-9a-f]{96})`, 'g');
  const token = (await logged(linkLine))[1]!;

  t.is((await post(`/approvals/${token}`, { approved: 'yes' })).status, 400, 'a malformed decision');
  t.is((await post(`/approvals/${token.slice(0, -1)}${token.endsWith('0') ? '1' : '0'}`, { approved: true })).status, 404, 'a tampered token');
  t.is((await until(runId, () => true)).run.status, 'waiting', 'refused calls changed nothing');

  const resumed = await post(`/approvals/${token}`, { approved: true, note: 'fine' });
  t.is(resumed.status, 201);
  t.deepEqual(resumed.json, { runId });
  t.is((await post(`/approvals/${token}`, { approved: false })).status, 404, 'a link works once');

  const done = await until(runId, (x) => TERMINAL.has(x.run.status));
  t.is(done.run.status, 'completed');
  t.is(done.run.waitKind, null);
  t.is(done.run.attempts, 1, 'the resumption was not another attempt');
  t.is(done.run.scope, 'expense:e-1');
  t.deepEqual(done.run.output, { expenseId: 'e-1', approved: true, note: 'fine', entry: 'paid-e-1-4200' });
  t.deepEqual(
    done.steps.map((s) => [s.stepId, s.status]),
    [
      ['manager-approval', 'completed'],
      ['book', 'completed'],
    ],
  );
  t.is(stdout.match(linkLine)?.length, 1, 'the link was sent once: deliver is not called again on resumption');
});

test.serial('SIGTERM drains the in-flight run, then the process exits by itself', async (t) => {
  const placed = await post('/orders', {
    orderId: 'o-slow',
    sku: 'sku-book',
    qty: 1,
    email: 'd@example.com',
    paymentLatencyMs: 800,
  });
  const runId = placed.json.runId as string;
  // In flight: stock reserved, payment call running.
  await until(runId, (x) => x.run.status === 'running' && x.steps.some((s) => s.stepId === 'charge-payment'));

  const t0 = Date.now();
  child.kill('SIGTERM');
  const timeout = new Promise<'hung'>((r) => setTimeout(() => r('hung'), 20_000).unref());
  const end = await Promise.race([exited, timeout]);
  const ms = Date.now() - t0;
  t.not(end, 'hung', `the process did not exit:\n${stdout}\n${stderr}`);
  t.deepEqual(end, { code: 0, signal: null }, stderr);

  const line = stdout.split('\n').find((l) => l.startsWith('{"shutdown"'));
  t.truthy(line, stdout);
  const summary = JSON.parse(line!) as { shutdown: string; runs: { id: string; jobType: string; status: string }[] };
  t.is(summary.shutdown, 'SIGTERM');
  const slow = summary.runs.find((r) => r.id === runId);
  t.is(slow?.status, 'completed', 'the in-flight run finished before the app closed');
  // Spawned after the worker stopped claiming: kept, pending, not lost.
  const notify = summary.runs.filter((r) => r.jobType === 'order.notify' && r.status === 'pending');
  t.is(notify.length, 1);
  t.regex(stdout, new RegExp(`\\[JobRun:${runId}\\] order o-slow charged`));
  t.true(ms >= 300, `shutdown waited for the payment step (${ms} ms)`);
});
