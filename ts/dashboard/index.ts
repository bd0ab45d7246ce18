/**
 * The web dashboard: `createDashboard(orchestrator, { basePath, authorize })`
 * → a Node `(req, res, next?)` handler (plain `http`, Express, Nest
 * middleware). Server-rendered pages, no script and no asset from anywhere
 * else (it works offline); every page reads through the orchestrator's
 * indexed queries only (counts, keyset pages, one run's rows).
 *
 * Live: each page loads the dashboard's own script (`/assets/live.js`),
 * which listens to `/events` (server-sent events: the store is looked at
 * once a second per open page, with the page's own query — the pool counts,
 * or the run's row — and a change is announced) and swaps in the page's
 * fresh content, without a reload.
 *
 * Security: `authorize(req, action)` decides every read and action and may
 * pin the tenant the request sees; without it the dashboard answers only
 * loopback requests and is read-only (and says so). Actions (cancel,
 * replay, a signal to a run that waits for one) are POST forms carrying
 * this dashboard's CSRF token, and a cross-origin `Origin` is refused.
 * Every value from a run is escaped (`html.ts`); the Content Security
 * Policy allows only the dashboard's own script.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { JobOrchestrator } from '../orchestrator';
import type { JobRun, JobRunStatus, JobStep, JobThroughputMinute, RunTreeNode } from '../rows';
import { esc, Html, html, json, when } from './html';

export type DashboardAction = 'read' | 'cancel' | 'replay' | 'signal' | 'resume';

/** The actions a run's page posts (each asks `authorize` under its name). */
type RunAction = Exclude<DashboardAction, 'read'>;

/**
 * Whether `req` may do `action`: `false` refuses (403); `true` allows (in
 * multi-tenant mode the viewer picks the tenant with `?tenant=`); `{
 * tenantId }` allows and pins the tenant every query and action uses.
 */
export type DashboardAuthorize = (
  req: IncomingMessage,
  action: DashboardAction,
) => boolean | { tenantId: string | null } | Promise<boolean | { tenantId: string | null }>;

export interface DashboardOptions {
  /** Where the dashboard is mounted (e.g. `'/jobs'`); links are built under it. Default `''`. */
  basePath?: string | undefined;
  authorize?: DashboardAuthorize | undefined;
  /** The page title. Default `'jobforge'`. */
  title?: string | undefined;
  /**
   * A secret the form token is derived from, the same in every replica
   * behind one address (a form one process rendered is then accepted by
   * another). Default: a random one per dashboard.
   */
  secret?: string | undefined;
}

export type DashboardHandler = (req: IncomingMessage, res: ServerResponse, next?: (err?: unknown) => void) => void;

const STATUSES: JobRunStatus[] = ['pending', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'canceled'];
const TERMINAL = new Set<JobRunStatus>(['completed', 'failed', 'timed_out', 'canceled']);
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const MAX_FORM = 4096;
/** A signal's form carries its payload: room for a JSON document. */
const MAX_SIGNAL_FORM = 64 * 1024;
/** Rows a `listJobRuns` page examines at most when it checks them one by one (the engine's `PAGE_WALK_BUDGET`). */
const PAGE_WALK_BUDGET = 5000;

/** Thrown inside a request: answered with its status and message. */
class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

interface Access {
  /** Pinned by `authorize`, or chosen with `?tenant=` (undefined: single-tenant). */
  tenantId: string | null | undefined;
  /** Actions are possible at all (an `authorize` was given). */
  canAct: boolean;
}

const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]']);

/**
 * A request from this machine to this machine by a loopback name. The
 * `Host` check stops DNS rebinding (a page of another site whose name now
 * points at 127.0.0.1 is same-origin with itself, not with `localhost`).
 * Behind a proxy on the same host every client looks local: give
 * `authorize` there.
 */
export function isLocalRequest(req: IncomingMessage): boolean {
  const a = req.socket?.remoteAddress ?? '';
  if (a !== '127.0.0.1' && a !== '::1' && a !== '::ffff:127.0.0.1') return false;
  const host = (req.headers.host ?? '').toLowerCase().replace(/:\d+$/, '');
  return LOOPBACK_HOSTS.has(host);
}

export function createDashboard(orchestrator: JobOrchestrator, opts: DashboardOptions = {}): DashboardHandler {
  const base = (opts.basePath ?? '').replace(/\/+$/, '');
  if (base !== '' && !base.startsWith('/')) throw new TypeError(`basePath must start with '/', got '${base}'`);
  const title = opts.title ?? 'jobforge';
  const authorize = opts.authorize;
  // The CSRF token of this dashboard: forms carry it; another site cannot
  // read it (same-origin policy), so it cannot forge a POST that has it.
  const csrf =
    opts.secret === undefined
      ? randomBytes(24).toString('base64url')
      : createHmac('sha256', opts.secret).update('jobforge dashboard form token').digest('base64url');
  const o = orchestrator;

  async function access(req: IncomingMessage, action: DashboardAction, url: URL): Promise<Access> {
    let pinned: { tenantId: string | null } | null = null;
    if (authorize) {
      const verdict: unknown = await authorize(req, action);
      if (verdict === false || verdict === null || verdict === undefined) throw new HttpError(403, 'not authorized');
      if (typeof verdict === 'object') {
        // Fail closed: `{ tenantId: req.user.tenantId }` with the claim
        // missing must not pin the tenant-less runs (null is said, not
        // defaulted to).
        const t = (verdict as { tenantId?: unknown }).tenantId;
        if (o.multiTenant && t !== null && typeof t !== 'string') {
          throw new HttpError(403, 'authorize answered an object without a tenantId (a string, or null for the runs without a tenant)');
        }
        pinned = { tenantId: typeof t === 'string' ? t : null };
      } else if (verdict !== true) {
        // Only true grants every tenant: a tenant id answered as a string is not a pin.
        throw new HttpError(403, 'authorize must answer true, false or { tenantId }');
      }
    } else {
      if (!isLocalRequest(req)) {
        throw new HttpError(403, 'this dashboard has no authorize option: it answers loopback requests to localhost, 127.0.0.1 or [::1] only');
      }
      if (action !== 'read') throw new HttpError(403, 'this dashboard is read-only: pass an authorize option to enable actions');
    }
    let tenantId: string | null | undefined;
    if (o.multiTenant) tenantId = pinned ? pinned.tenantId : url.searchParams.get('tenant');
    return { tenantId, canAct: authorize !== undefined };
  }

  const link = (path: string, q: Record<string, string | null | undefined> = {}, a?: Access): string => {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(q)) if (v !== undefined && v !== null && v !== '') p.set(k, v);
    if (a?.tenantId !== undefined && a.tenantId !== null) p.set('tenant', a.tenantId);
    const s = p.toString();
    return `${base}${path}${s ? `?${s}` : ''}`;
  };

  function page(heading: string, a: Access, body: Html, run?: string): string {
    const events = link('/events', { run }, a);
    const tenant = a.tenantId === undefined ? '' : html` · tenant <b>${a.tenantId ?? '(none)'}</b>`;
    const readOnly = a.canAct ? '' : html`<p class="note">Read-only: this dashboard was created without <code>authorize</code> and answers loopback requests only.</p>`;
    return html`<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${heading} · ${title}</title><style>${new Html(CSS)}</style>
<script src="${link('/assets/live.js')}" data-events="${events}" defer></script></head><body>
<header><a class="brand" href="${link('/', {}, a)}">${title}</a>
<nav><a href="${link('/', {}, a)}">Overview</a><a href="${link('/runs', {}, a)}">Runs</a><a href="${link('/schedules', {}, a)}">Schedules</a></nav>${tenant}</header>
<main><h1>${heading}</h1>${readOnly}${body}</main></body></html>`.text;
  }

  const status = (s: string): Html => html`<span class="st st-${s}">${s}</span>`;
  const runLink = (id: string, a: Access, text?: string): Html => html`<a class="id" href="${link(`/runs/${encodeURIComponent(id)}`, {}, a)}">${text ?? id}</a>`;

  async function overview(a: Access): Promise<string> {
    const counts = await o.countByPoolAndStatus(a.tenantId);
    const failed = await o.listRecentFailed(20, a.tenantId);
    const pools = [...new Set(counts.map((c) => c.pool))].sort();
    const count = (p: string, s: string): number => counts.find((c) => c.pool === p && c.status === s)?.count ?? 0;
    const minutes = await o.throughput({ tenantId: a.tenantId });
    const byType = new Map<string, number>();
    for (const f of failed) byType.set(f.jobType, (byType.get(f.jobType) ?? 0) + 1);
    const body = html`<section><h2>Ended in the last hour, per minute</h2>${chart(minutes)}</section>
<section><h2>Runs by pool and status</h2>
<table><thead><tr><th>pool</th>${STATUSES.map((s) => html`<th>${s}</th>`)}</tr></thead><tbody>
${pools.map((p) => html`<tr><td>${p}</td>${STATUSES.map((s) => html`<td class="num"><a href="${link('/runs', { pool: p, status: s }, a)}">${count(p, s)}</a></td>`)}</tr>`)}
</tbody></table>${pools.length === 0 ? html`<p class="note">No runs yet.</p>` : ''}</section>
<section><h2>Failing job types (last ${failed.length} failures)</h2><table><thead><tr><th>job type</th><th>failures</th></tr></thead><tbody>
${[...byType.entries()].sort((x, y) => y[1] - x[1]).map(([type, n]) => html`<tr><td><a href="${link('/runs', { type, status: 'failed' }, a)}">${type}</a></td><td class="num">${n}</td></tr>`)}
</tbody></table></section>
<section><h2>Recent failures</h2><table><thead><tr><th>run</th><th>job type</th><th>pool</th><th>attempts</th><th>error</th><th>failed at</th></tr></thead><tbody>
${failed.map((f) => html`<tr><td>${runLink(f.runId, a, f.runId.slice(0, 8))}</td><td>${f.jobType}</td><td>${f.pool}</td><td class="num">${f.attempts}</td><td class="err">${f.errorMessage ?? ''}</td><td>${when(f.failedAt)}</td></tr>`)}
</tbody></table></section>`;
    return page('Overview', a, body);
  }

  /** An SVG bar per minute: completed (green) under failed and timed out (red) under canceled (grey). */
  function chart(minutes: JobThroughputMinute[]): Html {
    const W = 960;
    const H = 120;
    const bw = W / Math.max(minutes.length, 1);
    const total = (m: JobThroughputMinute): number => m.completed + m.failed + m.timedOut + m.canceled;
    const max = Math.max(1, ...minutes.map(total));
    const sum = minutes.reduce((s, m) => ({ ok: s.ok + m.completed, bad: s.bad + m.failed + m.timedOut, gone: s.gone + m.canceled }), { ok: 0, bad: 0, gone: 0 });
    const bars = minutes.map((m, i) => {
      let y = H;
      const part = (n: number, cls: string): Html => {
        const h = (n / max) * (H - 4);
        y -= h;
        return n > 0 ? html`<rect class="${cls}" x="${(i * bw + 1).toFixed(1)}" y="${y.toFixed(1)}" width="${Math.max(bw - 2, 1).toFixed(1)}" height="${h.toFixed(1)}"></rect>` : html``;
      };
      const label = `${when(m.at)}: ${m.completed} completed, ${m.failed} failed, ${m.timedOut} timed out, ${m.canceled} canceled`;
      return html`<g><title>${label}</title>${part(m.completed, 'ok')}${part(m.failed + m.timedOut, 'bad')}${part(m.canceled, 'gone')}</g>`;
    });
    return html`<svg class="chart" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img" aria-label="runs ended per minute"><line x1="0" y1="${H}" x2="${W}" y2="${H}"></line>${bars}</svg>
<p class="legend"><span class="k ok"></span>${sum.ok} completed <span class="k bad"></span>${sum.bad} failed or timed out <span class="k gone"></span>${sum.gone} canceled · the tallest minute: ${max}</p>`;
  }

  async function runs(a: Access, url: URL): Promise<string> {
    const param = (k: string): string => url.searchParams.get(k) ?? '';
    const st = param('status');
    const pool = param('pool');
    const type = param('type');
    const scopeType = param('scopeType');
    const scopeId = param('scopeId');
    const root = param('root');
    const cursor = url.searchParams.get('cursor') ?? undefined;
    if (st !== '' && !STATUSES.includes(st as JobRunStatus)) throw new HttpError(400, `unknown status '${st}'`);
    if ((scopeType === '') !== (scopeId === '')) throw new HttpError(400, 'a scope filter needs both its entity type and its entity id');
    const q = {
      status: st === '' ? undefined : (st as JobRunStatus),
      poolId: pool === '' ? undefined : pool,
      jobType: type === '' ? undefined : type,
      scopeEntityType: scopeType === '' ? undefined : scopeType,
      scopeEntityId: scopeId === '' ? undefined : scopeId,
      rootRunId: root === '' ? undefined : root,
      cursor,
      limit: 50,
      tenantId: a.tenantId,
    };
    const pageOf = await o.listJobRuns(q);
    const filters = { status: st, pool, type, scopeType, scopeId, root };
    // A page cut short by the rows it may examine (see `listJobRuns`) says so.
    const short = pageOf.nextCursor !== null && pageOf.items.length < q.limit;
    const body = html`<form class="filters" method="get" action="${link('/runs')}">
${a.tenantId !== undefined && a.tenantId !== null ? html`<input type="hidden" name="tenant" value="${a.tenantId}">` : ''}
<label>status <select name="status"><option value="">any</option>${STATUSES.map((s) => html`<option${s === st ? new Html(' selected') : ''}>${s}</option>`)}</select></label>
<label>pool <input name="pool" value="${pool}"></label>
<label>job type <input name="type" value="${type}"></label>
<label>scope <input name="scopeType" value="${scopeType}" placeholder="entity type" size="12"> <input name="scopeId" value="${scopeId}" placeholder="entity id" size="16"></label>
${root !== '' ? html`<label>tree of <input name="root" value="${root}" size="36"></label>` : ''}
<button type="submit">Filter</button></form>
<table><thead><tr><th>run</th><th>job type</th><th>pool</th><th>status</th><th>attempts</th><th>created</th><th>error</th></tr></thead><tbody>
${pageOf.items.map((r) => html`<tr><td>${runLink(r.runId, a, r.runId.slice(0, 8))}</td><td>${r.jobType}</td><td>${r.pool}</td><td>${status(r.status)}</td><td class="num">${r.attempts}</td><td>${when(r.createdAt)}</td><td class="err">${r.errorMessage ?? ''}</td></tr>`)}
</tbody></table>${pageOf.items.length === 0 && !short ? html`<p class="note">No runs match.</p>` : ''}
${short ? html`<p class="note">This page looked at ${PAGE_WALK_BUDGET.toLocaleString('en')} runs (a filter no index holds, such as the job type, is checked run by run) and found ${pageOf.items.length}; older runs may match.</p>` : ''}
${pageOf.nextCursor ? html`<p><a class="next" href="${link('/runs', { ...filters, cursor: pageOf.nextCursor }, a)}">Older runs →</a></p>` : ''}`;
    return page('Runs', a, body);
  }

  function tree(node: RunTreeNode, current: string, a: Access): Html {
    const r = node.run;
    const me = r.id === current ? html` <b>(this run)</b>` : '';
    return html`<li>${runLink(r.id, a, `${r.jobType} ${r.id.slice(0, 8)}`)} ${status(r.status)}${me}${node.children.length ? html`<ul>${node.children.map((c) => tree(c, current, a))}</ul>` : ''}</li>`;
  }

  async function run(a: Access, id: string, url: URL): Promise<string> {
    const tenant = { tenantId: a.tenantId };
    const r: JobRun | null = UUID.test(id) ? await o.getRun(id, a.tenantId) : null;
    if (!r) throw new HttpError(404, `run ${id} not found`);
    const steps = await o.listSteps(id, tenant);
    const events = await o.listRunEvents(id, { ...tenant, limit: 500, cursor: url.searchParams.get('events') ?? undefined });
    // The whole tree only when it is small: a run among 20,000 siblings
    // would make a page of megabytes (and its live refresh as much). One
    // page of the tree's runs tells which it is; a larger tree is listed
    // on the runs page instead, in pages.
    const probe = await o.listJobRuns({ ...tenant, rootRunId: r.rootRunId, limit: TREE_DRAWN_MAX });
    const root = probe.nextCursor === null ? await o.getRunTree(r.rootRunId, tenant) : null;
    const treeList = link('/runs', { root: r.rootRunId }, a);
    const actionUrl = (action: RunAction): string => link(`/runs/${encodeURIComponent(id)}/${action}`, {}, a);
    const form = (action: 'cancel' | 'replay', label: string): Html =>
      a.canAct
        ? html`<form method="post" action="${actionUrl(action)}"><input type="hidden" name="csrf" value="${csrf}"><button type="submit" class="act act-${action}">${label}</button></form>`
        : html``;
    const actions = TERMINAL.has(r.status) ? form('replay', 'Replay') : form('cancel', 'Cancel run');
    // What the run waits on, from its open wait steps (a wait step's input is what it waits for).
    const signals = TERMINAL.has(r.status) ? [] : openSignalWaits(steps);
    const waitsOn = r.waitKind
      ? `${r.waitKind}${r.waitKind === 'signal' && signals.length > 0 ? ` ${signals.map((n) => `'${n}'`).join(', ')}` : ''}${r.waitDeadline ? ` until ${when(r.waitDeadline)}` : ''}`
      : '—';
    const sent = url.searchParams.get('signal');
    const signalNote =
      sent === 'delivered'
        ? html`<p class="note">The signal was delivered: a wait took it and the run resumes.</p>`
        : sent === 'inbox'
          ? html`<p class="note">No open wait took the signal: it waits in the run's inbox for the next wait of its name.</p>`
          : '';
    const signalForm =
      a.canAct && (signals.length > 0 || (r.waitKind === 'signal' && !TERMINAL.has(r.status)))
        ? html`<section><h2>Send a signal</h2><form class="signal" method="post" action="${actionUrl('signal')}"><input type="hidden" name="csrf" value="${csrf}">
<label>signal <input name="signal" value="${signals[0] ?? ''}" list="open-signals" required></label><datalist id="open-signals">${signals.map((n) => html`<option value="${n}">`)}</datalist>
<label>payload (JSON; empty: null) <textarea name="payload" rows="4"></textarea></label>
<button type="submit" class="act act-signal">Send signal</button></form></section>`
        : '';
    const resumed = url.searchParams.get('resumed') === '1' ? html`<p class="note">The token was taken: its wait resolved with the payload and the run resumes.</p>` : '';
    // Only a token's hash is stored: the form takes the token from whoever holds it.
    const tokenWait = !TERMINAL.has(r.status) && (r.waitKind === 'token' || hasOpenTokenWait(steps));
    const tokenForm = !tokenWait
      ? ''
      : a.canAct
        ? html`<section><h2>Resume with its token</h2><p class="note">The run waits on a resume token. Only its hash is stored: paste the token <code>ctx.waitForToken</code> handed out.</p><form class="resume" method="post" action="${actionUrl('resume')}"><input type="hidden" name="csrf" value="${csrf}">
<label>token <input name="token" required autocomplete="off" spellcheck="false"></label>
<label>payload (JSON; empty: null) <textarea name="payload" rows="4"></textarea></label>
<button type="submit" class="act act-resume">Resume</button></form></section>`
        : html`<p class="note">This run waits on a resume token: whoever holds it calls <code>resume(token, payload)</code>.</p>`;
    const field = (k: string, v: unknown): Html => html`<dt>${k}</dt><dd>${v}</dd>`;
    const body = html`<div class="actions">${actions}</div>
<dl class="row">${[
      field('id', r.id),
      field('status', status(r.status)),
      field('job type', html`<a href="${link('/runs', { type: r.jobType }, a)}">${r.jobType}</a> (v${r.jobVersion})`),
      field('pool', r.pool),
      field('tenant', r.tenantId ?? '—'),
      field('priority', r.priority),
      field('attempts', r.attempts),
      field('trigger', `${r.triggerSource}${r.triggerRef ? `: ${r.triggerRef}` : ''}`),
      field('parent', r.parentRunId ? runLink(r.parentRunId, a) : '—'),
      field('scope', r.scopeEntityType ? html`<a href="${link('/runs', { scopeType: r.scopeEntityType, scopeId: r.scopeEntityId ?? '' }, a)}">${r.scopeEntityType}:${r.scopeEntityId ?? ''}</a>` : '—'),
      field('concurrency key', r.concurrencyKey ?? '—'),
      field('dedupe key', r.dedupeKey ?? '—'),
      field('waits on', waitsOn),
      field('run at', when(r.runAt)),
      field('created', when(r.createdAt)),
      field('started', when(r.startedAt)),
      field('finished', when(r.finishedAt)),
    ]}</dl>
${signalNote}${resumed}${signalForm}${tokenForm}
${r.error ? html`<section><h2>Error</h2><pre class="err">${r.error.message}${r.error.stack ? `\n\n${r.error.stack}` : ''}</pre></section>` : ''}
<section><h2>Input</h2><pre>${json(r.input)}</pre></section>
${r.output !== null && r.output !== undefined ? html`<section><h2>Output</h2><pre>${json(r.output)}</pre></section>` : ''}
<section><h2>Tags</h2><pre>${json(r.tags)}</pre></section>
<section><h2>Timeline</h2><table><thead><tr><th>at</th><th>event</th><th>attempt</th><th>details</th></tr></thead><tbody>
${events.items.map((e) => html`<tr><td>${when(e.at)}</td><td class="ev ev-${e.type}">${e.type}</td><td class="num">${e.attempt}</td><td><code>${e.data ? json(e.data).replace(/\s*\n\s*/g, ' ') : ''}</code></td></tr>`)}
</tbody></table>${events.nextCursor ? html`<p><a href="${link(`/runs/${encodeURIComponent(id)}`, { events: events.nextCursor }, a)}">Later events →</a></p>` : ''}</section>
<section><h2>Steps</h2><table><thead><tr><th>#</th><th>step</th><th>kind</th><th>status</th><th>attempts</th><th>started</th><th>finished</th><th>error</th></tr></thead><tbody>
${steps.map((s) => html`<tr><td class="num">${s.seq}</td><td>${s.stepId}</td><td>${s.kind}</td><td>${status(s.status)}</td><td class="num">${s.attempts}</td><td>${when(s.startedAt)}</td><td>${when(s.finishedAt)}</td><td class="err">${s.error?.message ?? ''}</td></tr>`)}
</tbody></table></section>
${
  root
    ? html`<section><h2>Run tree</h2><ul class="tree">${tree(root, r.id, a)}</ul></section>`
    : html`<section><h2>Run tree</h2><p class="note">Its tree holds more than ${TREE_DRAWN_MAX} runs: not drawn here. ${r.parentRunId ? html`Parent: ${runLink(r.parentRunId, a)}. ` : ''}<a href="${treeList}">List the tree's runs</a>.</p></section>`
}`;
    return page(`Run ${r.id.slice(0, 8)}`, a, body, r.id);
  }

  async function schedules(a: Access): Promise<string> {
    const list = await o.listSchedules({ tenantId: a.tenantId });
    const body = html`<table><thead><tr><th>name</th><th>job type</th><th>timing</th><th>next fire</th><th>last fire</th><th>last run</th><th>last error</th></tr></thead><tbody>
${list.map((s) => html`<tr><td>${s.name}</td><td>${s.jobType}</td><td>${s.cron ? `cron ${s.cron} (${s.timezone ?? 'UTC'})` : `every ${s.everyMs} ms`}</td><td>${when(s.nextRunAt)}</td><td>${when(s.lastRunAt)}</td><td>${s.lastRunId ? runLink(s.lastRunId, a, s.lastRunId.slice(0, 8)) : '—'}</td><td class="err">${(s as { lastError?: string | null }).lastError ?? ''}</td></tr>`)}
</tbody></table>${list.length === 0 ? html`<p class="note">No schedules.</p>` : ''}`;
    return page('Schedules', a, body);
  }

  /**
   * `/events`: a `change` event whenever what the page shows may have
   * changed (its run's row, or the counts per pool and status), looked at
   * once a second; a comment every 15 s keeps proxies from closing it.
   */
  async function events(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    // Listened to first: a client gone during the awaits below leaves no timer.
    let gone = false;
    res.on('close', () => (gone = true));
    const a = await access(req, 'read', url);
    const run = url.searchParams.get('run');
    if (run !== null && !UUID.test(run)) throw new HttpError(404, `run ${run} not found`);
    // What the page shows may have changed when this does: the run's row;
    // else the live gauges and this process's counters (the metrics text:
    // O(live runs), not a count of every run each second) and the newest
    // failure (an index's first entry).
    const look = async (): Promise<string> => {
      if (run !== null) {
        const r = await o.getRun(run, a.tenantId);
        return r ? `${r.status} ${r.updatedAt.getTime()}` : 'gone';
      }
      const failed = await o.listRecentFailed(1, a.tenantId);
      return `${await o.metrics()}${failed[0]?.runId ?? ''}`;
    };
    let last = await look();
    if (gone || res.destroyed) return;
    res.writeHead(200, {
      'Content-Type': 'text/event-stream; charset=utf-8',
      'Cache-Control': 'no-store',
      'X-Content-Type-Options': 'nosniff',
      Connection: 'keep-alive',
    });
    res.write(': live\n\n');
    let beats = 0;
    let looking = false;
    const timer = setInterval(() => {
      if (looking) return;
      looking = true;
      look().then(
        (now) => {
          looking = false;
          if (now !== last) {
            last = now;
            res.write('event: change\ndata: 1\n\n');
          } else if (++beats % 15 === 0) {
            res.write(': beat\n\n');
          }
        },
        () => {
          looking = false;
        },
      );
    }, LIVE_MS);
    res.on('close', () => clearInterval(timer));
  }

  async function readForm(req: IncomingMessage, max: number): Promise<URLSearchParams> {
    // A framework's body parser (Express' urlencoded, on by default in
    // Nest) may have read the stream already: its flat string fields are
    // the form (the parser applied its own size limit).
    // Only when the stream was read: a parser for another type leaves `{}`
    // in `body` and the stream unread.
    const parsed = (req as { body?: unknown }).body;
    if (req.readableEnded && parsed !== null && typeof parsed === 'object' && !Buffer.isBuffer(parsed)) {
      const form = new URLSearchParams();
      for (const [k, v] of Object.entries(parsed as Record<string, unknown>)) if (typeof v === 'string') form.set(k, v);
      if (JSON.stringify([...form]).length > max) throw new HttpError(413, 'form too large');
      return form;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const c of req as AsyncIterable<Buffer>) {
      size += c.length;
      if (size > max) throw new HttpError(413, 'form too large');
      chunks.push(c);
    }
    return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
  }

  /** A POST from a page of this dashboard: its `Origin` (or, without one, its `Referer`) is this host. */
  function sameOrigin(req: IncomingMessage): boolean {
    const from = req.headers.origin ?? req.headers.referer;
    if (from === undefined || from === 'null') return false;
    try {
      return new URL(from).host === req.headers.host;
    } catch {
      return false;
    }
  }

  async function act(req: IncomingMessage, res: ServerResponse, url: URL, id: string, action: RunAction): Promise<void> {
    const a = await access(req, action, url);
    if (!sameOrigin(req)) throw new HttpError(403, 'cross-origin request refused');
    const form = await readForm(req, action === 'signal' || action === 'resume' ? MAX_SIGNAL_FORM : MAX_FORM);
    const token = Buffer.from(form.get('csrf') ?? '');
    const want = Buffer.from(csrf);
    if (token.length !== want.length || !timingSafeEqual(token, want)) throw new HttpError(403, 'missing or stale form token (reload the page)');
    if (!UUID.test(id)) throw new HttpError(404, `run ${id} not found`);
    const tenant = { tenantId: a.tenantId };
    const back: Record<string, string> = {};
    if (action === 'cancel') {
      // Only a run this request may see (cancel of another tenant's run is a no-op anyway).
      if (!(await o.getRun(id, a.tenantId))) throw new HttpError(404, `run ${id} not found`);
      await o.cancel(id, { cascade: true, reason: 'dashboard', ...tenant });
    } else if (action === 'replay') {
      await o.replay(id, tenant);
    } else if (action === 'signal') {
      const name = form.get('signal') ?? '';
      if (name === '') throw new HttpError(400, 'the signal needs a name');
      const payload = parsePayload(form.get('payload') ?? '');
      const { delivered } = await o.signal(id, name, payload, tenant);
      back.signal = delivered ? 'delivered' : 'inbox';
    } else {
      const token = (form.get('token') ?? '').trim();
      if (token === '') throw new HttpError(400, 'paste the resume token');
      const payload = parsePayload(form.get('payload') ?? '');
      // Only this page's run: another run's token is refused (authorize saw this one).
      await o.resume(token, payload, { ...tenant, runId: id });
      back.resumed = '1';
    }
    res.statusCode = 303;
    res.setHeader('Location', link(`/runs/${encodeURIComponent(id)}`, back, a));
    res.end();
  }

  async function serve(req: IncomingMessage, res: ServerResponse): Promise<boolean> {
    const url = new URL(req.url ?? '/', 'http://dashboard.invalid');
    let path = url.pathname;
    // Mounted by Express/Nest (`app.use(path, …)`), `req.url` is already the
    // path under the mount (`req.baseUrl` the mount): stripping the base
    // again would break a mount whose name is one of the pages ('/runs').
    // Plain `http` (or an unmounted `app.use`): the whole path.
    const mount = (req as { baseUrl?: unknown }).baseUrl;
    const stripped = typeof mount === 'string' && mount !== '';
    if (!stripped && base !== '' && (path === base || path.startsWith(`${base}/`))) path = path.slice(base.length);
    if (path === '') path = '/';
    const runAction = /^\/runs\/([^/]+)\/(cancel|replay|signal|resume)$/.exec(path);
    if (runAction) {
      if (req.method !== 'POST') throw new HttpError(405, 'use POST');
      await act(req, res, url, pathSegment(runAction[1]!), runAction[2] as RunAction);
      return true;
    }
    const known = path === '/' || path === '/runs' || path === '/schedules' || path === '/events' || path === '/assets/live.js' || /^\/runs\/[^/]+$/.test(path);
    if (!known) return false;
    if (req.method !== 'GET' && !(req.method === 'HEAD' && path !== '/events')) throw new HttpError(405, 'use GET');
    if (path === '/assets/live.js') {
      res.statusCode = 200;
      res.setHeader('Content-Type', 'text/javascript; charset=utf-8');
      res.setHeader('Cache-Control', 'max-age=3600');
      res.setHeader('X-Content-Type-Options', 'nosniff');
      res.end(LIVE_JS);
      return true;
    }
    if (path === '/events') {
      await events(req, res, url);
      return true;
    }
    const runPage = /^\/runs\/([^/]+)$/.exec(path);
    let body: string | null = null;
    if (path === '/' || path === '/runs' || path === '/schedules' || runPage) {
      const a = await access(req, 'read', url);
      if (path === '/') body = await overview(a);
      else if (path === '/runs') body = await runs(a, url);
      else if (path === '/schedules') body = await schedules(a);
      else body = await run(a, pathSegment(runPage![1]!), url);
    }
    if (body === null) return false;
    send(res, 200, body);
    return true;
  }

  function send(res: ServerResponse, code: number, body: string): void {
    res.statusCode = code;
    res.setHeader('Content-Type', 'text/html; charset=utf-8');
    res.setHeader('Content-Security-Policy', "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'");
    res.setHeader('X-Content-Type-Options', 'nosniff');
    res.setHeader('Referrer-Policy', 'same-origin');
    res.setHeader('Cache-Control', 'no-store');
    res.end(body);
  }

  return (req, res, next) => {
    serve(req, res).then(
      (handled) => {
        if (handled) return;
        if (next) return next();
        send(res, 404, `<!doctype html><title>not found</title><p>Not found.</p>`);
      },
      (e: unknown) => {
        if (res.headersSent) return res.end();
        const codeOf = (e as { code?: unknown }).code;
        const code =
          e instanceof HttpError
            ? e.status
            : codeOf === 'JOB_RUN_NOT_FOUND'
              ? 404
              : codeOf === 'JOB_INPUT_INVALID' || codeOf === 'MISSING_TENANT_ID' || codeOf === 'JOB_RESUME_TOKEN'
                ? 400
                : codeOf === 'JOB_RUN_STATE' || codeOf === 'JOB_NOT_REPLAYABLE'
                  ? 409
                  : 500;
        const message = e instanceof Error ? e.message : String(e);
        send(res, code, `<!doctype html><title>${code}</title><h1>${code}</h1><p>${esc(message)}</p>`);
      },
    );
  };
}

/** A run page draws its run's tree up to this many runs. */
const TREE_DRAWN_MAX = 200;

/** A run id from the path: a malformed %-escape is the client's error (400), not the server's. */
function pathSegment(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw new HttpError(400, 'malformed %-escape in the path');
  }
}

/** The signal names a run's open `waitForSignal` steps wait for, in step order, each once. */
function openSignalWaits(steps: JobStep[]): string[] {
  const names: string[] = [];
  for (const s of steps) {
    const wait = s.kind === 'wait' && s.status === 'running' ? s.input : null;
    if (wait?.wait === 'signal' && typeof wait.signal === 'string' && !names.includes(wait.signal)) names.push(wait.signal);
  }
  return names;
}

/** Whether a run has an open `waitForToken` step (it may wait on a token beside other waits). */
function hasOpenTokenWait(steps: JobStep[]): boolean {
  return steps.some((s) => s.kind === 'wait' && s.status === 'running' && s.input?.wait === 'token');
}

/** A signal's payload from its form: empty is none (the wait resolves with null); other text must be JSON. */
function parsePayload(text: string): unknown {
  if (text.trim() === '') return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch (e) {
    throw new HttpError(400, `the payload is not JSON (${e instanceof Error ? e.message : String(e)}): nothing was sent`);
  }
}

/** How often an open page's `/events` looks at the store. */
const LIVE_MS = 1000;

/**
 * The page's script: on a `change` event, fetch the page again and put its
 * fresh `<main>` in place of the old one (the server escaped it).
 */
const LIVE_JS = `(function () {
  var me = document.currentScript;
  var src = me && me.getAttribute('data-events');
  if (!src || !window.EventSource || !window.fetch || !window.DOMParser) return;
  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.href, { credentials: 'same-origin' })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text === null) return;
        var fresh = new DOMParser().parseFromString(text, 'text/html').querySelector('main');
        var old = document.querySelector('main');
        if (fresh && old) { old.replaceWith(fresh); document.documentElement.setAttribute('data-live', String(Date.now())); }
      })
      .catch(function () {})
      .then(function () { busy = false; if (again) { again = false; refresh(); } });
  }
  new EventSource(src).addEventListener('change', refresh);
})();
`;

const CSS = `
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{display:flex;gap:1.5rem;align-items:center;padding:.6rem 1.2rem;background:#1d2330;color:#dfe4ee}
header a{color:#dfe4ee;text-decoration:none}.brand{font-weight:700}nav{display:flex;gap:1rem}
main{padding:1rem 1.4rem;max-width:1200px}h1{font-size:1.4rem;margin:.2rem 0 1rem}h2{font-size:1.05rem;margin:1.4rem 0 .5rem}
table{border-collapse:collapse;background:#fff;width:100%}th,td{padding:.3rem .55rem;border-bottom:1px solid #e3e6eb;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #e3e6eb;padding:.6rem;overflow:auto;max-height:24rem}pre.err,td.err{color:#a0181f}
.st{padding:.05rem .45rem;border-radius:.6rem;font-size:.85em;background:#e3e6eb}.st-completed{background:#d6f2dc}.st-failed,.st-timed_out{background:#fbd9db}
.st-running{background:#d7e7fb}.st-waiting{background:#f7ecc8}.st-canceled{background:#e6e0f0}
dl.row{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem;background:#fff;padding:.7rem;border:1px solid #e3e6eb}dt{color:#5b6475}dd{margin:0}
.note{color:#5b6475;font-style:italic}.filters{display:flex;gap:1rem;margin-bottom:.7rem;align-items:center}.actions{float:right}
button.act{padding:.35rem .8rem;border:1px solid #8a93a6;border-radius:.3rem;background:#fff;cursor:pointer}button.act-cancel{border-color:#a0181f;color:#a0181f}
svg.chart{width:100%;height:120px;background:#fff;border:1px solid #e3e6eb}svg.chart line{stroke:#8a93a6}
rect.ok,.k.ok{fill:#4caf6a;background:#4caf6a}rect.bad,.k.bad{fill:#d2424b;background:#d2424b}rect.gone,.k.gone{fill:#9c92b4;background:#9c92b4}
.legend{color:#5b6475}.k{display:inline-block;width:.8em;height:.8em;margin:0 .25em 0 .8em;vertical-align:-1px}
form.signal{display:flex;flex-direction:column;gap:.5rem;max-width:40rem;background:#fff;padding:.7rem;border:1px solid #e3e6eb}
form.signal label{display:flex;flex-direction:column;gap:.2rem}form.signal textarea{font-family:ui-monospace,monospace}form.signal button{align-self:flex-start}
a.id{font-family:ui-monospace,monospace}ul.tree{background:#fff;padding:.6rem 1.6rem;border:1px solid #e3e6eb}code{font-size:.9em}
`;
