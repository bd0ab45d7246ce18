#!/usr/bin/env node
/*
 * The dashboard over an in-memory orchestrator with a little history
 * (completed, failed, retried, waiting, canceled runs, a parent with
 * children, a schedule) and a worker running:
 *
 *   node examples/dashboard.js              # serves http://127.0.0.1:4000/
 *   node examples/dashboard.js --screenshots # writes docs/dashboard-*.png (needs Chromium)
 *
 * Needs `npm run build` first. Cancel and replay work from loopback.
 */
'use strict';
const path = require('node:path');
const http = require('node:http');
const { JobOrchestrator, createDashboard, isLocalRequest } = require(path.join(__dirname, '..', 'dist'));

const quiet = { log() {}, info() {}, warn() {}, error() {}, debug() {} };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function seed() {
  const o = new JobOrchestrator({ loggerFactory: () => quiet, logger: quiet });
  o.registerHandler('invoice.render', { pool: 'batch', retry: { attempts: 3, backoff: 'fixed', baseMs: 50 } }, async (ctx) => {
    const pdf = await ctx.step('render pdf', () => ({ pages: 2 }));
    if (ctx.input.n % 7 === 3 && ctx.run.attempts === 0) throw new Error('renderer busy, try again');
    await ctx.step('upload', () => ({ url: `s3://invoices/${ctx.input.n}.pdf` }));
    return { pdf };
  });
  o.registerHandler('payment.charge', { pool: 'interactive' }, async (ctx) => {
    await ctx.step('authorize card', () => ({ ok: ctx.input.amount < 900 }));
    if (ctx.input.amount >= 900) {
      const e = new Error(`card declined: amount ${ctx.input.amount} over the limit`);
      e.name = 'CardDeclined';
      throw e;
    }
    return { charged: ctx.input.amount };
  });
  o.registerHandler('order.fulfil', { pool: 'batch' }, async (ctx) => {
    const receipt = await ctx.invoke('charge', 'payment.charge', { amount: ctx.input.amount });
    await ctx.sleep('cool-off', ctx.input.amount > 500 ? 3_600_000 : 1);
    return { receipt };
  });
  o.registerHandler('approval.wait', { pool: 'batch' }, async (ctx) => ctx.waitForSignal('approved'));
  await o.schedule('nightly-report', { jobType: 'invoice.render', input: { n: 0 }, cron: '0 2 * * *' });
  for (let n = 1; n <= 24; n++) await o.start('invoice.render', { n });
  for (const amount of [120, 950, 300, 999, 640]) await o.start('order.fulfil', { amount });
  await o.start('approval.wait', { request: 'refund #1182' });
  const doomed = await o.start('invoice.render', { n: 99 }, { runAt: new Date(Date.now() + 3_600_000) });
  await o.cancel(doomed.id);
  const w = o.startWorker({ pools: { batch: { concurrency: 4 }, interactive: { concurrency: 2 } } });
  await sleep(600);
  return { o, w };
}

async function main() {
  const { o, w } = await seed();
  const handler = createDashboard(o, { authorize: isLocalRequest, title: 'jobforge demo' });
  const server = http.createServer((req, res) => handler(req, res));
  const shots = process.argv.includes('--screenshots');
  await new Promise((r) => server.listen(shots ? 0 : 4000, '127.0.0.1', r));
  const base = `http://127.0.0.1:${server.address().port}`;
  if (!shots) {
    console.log(`dashboard at ${base}/ (Ctrl-C stops it)`);
    return;
  }
  const chromium = [process.env.CHROMIUM_PATH, '/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => p && require('node:fs').existsSync(p));
  if (!chromium) throw new Error('no Chromium: apt-get install chromium, or set CHROMIUM_PATH');
  const puppeteer = require('puppeteer-core');
  const browser = await puppeteer.launch({ executablePath: chromium, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1200, height: 900 });
    const docs = path.join(__dirname, '..', 'docs');
    require('node:fs').mkdirSync(docs, { recursive: true });
    await page.goto(`${base}/`);
    await page.screenshot({ path: path.join(docs, 'dashboard-overview.png'), fullPage: true });
    const failed = (await o.listRecentFailed(1))[0];
    const parent = (await o.listJobRuns({ status: 'waiting', limit: 5 })).items.find((r) => r.jobType === 'order.fulfil');
    const target = failed ? failed.runId : parent.runId;
    await page.goto(`${base}/runs/${target}`);
    await page.screenshot({ path: path.join(docs, 'dashboard-run.png'), fullPage: true });
    console.log('wrote docs/dashboard-overview.png and docs/dashboard-run.png');
  } finally {
    await browser.close();
    await w.stop();
    server.close();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
