/**
 * The dashboard in a real browser (headless Chromium from the system's
 * package, driven by puppeteer-core; nothing downloads a browser): open the
 * overview, filter the runs, open a failed run and read its error and
 * timeline, cancel a running run from its page, and see a page update
 * itself when the run changes elsewhere. Skips with a message where no
 * Chromium is installed, except in CI (`CI` set), where that fails.
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { existsSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createDashboard } from '../dist';
import type { JobContext, JobOrchestrator } from '../dist';
import { hanging, manual } from './helpers';

const CANDIDATES = [process.env.CHROMIUM_PATH, '/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'];
const chromium = CANDIDATES.find((p): p is string => typeof p === 'string' && p !== '' && existsSync(p));
const inCi = process.env.CI !== undefined && process.env.CI !== '' && process.env.CI !== 'false';

async function serve(t: ExecutionContext, o: JobOrchestrator): Promise<string> {
  const handler = createDashboard(o, { authorize: () => true });
  const server = createServer((req, res) => handler(req, res));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

if (!chromium) {
  if (inCi) {
    test('dashboard in a browser: Chromium is required in CI', (t) => {
      t.fail(`no Chromium at ${CANDIDATES.filter(Boolean).join(', ')} (.ci/run installs Debian's chromium)`);
    });
  } else {
    test('dashboard in a browser: skipped, no Chromium installed', (t) => {
      t.log(`no Chromium at ${CANDIDATES.filter(Boolean).join(', ')}: apt-get install chromium, or set CHROMIUM_PATH`);
      t.pass();
    });
  }
} else {
  test.serial('dashboard in a browser: overview, filter, a failed run, cancel from the page, live update', async (t) => {
    const puppeteer = await import('puppeteer-core');
    const o = manual();
    o.registerHandler('shop.charge', {}, async (ctx: JobContext<unknown>) => {
      await ctx.step('authorize card', () => ({ ok: true }));
      throw new Error('card declined: insufficient funds');
    });
    const h = hanging();
    o.registerHandler('shop.ship', {}, h.handler);
    o.registerHandler('shop.mail', {}, async () => ({ sent: true }));
    const failed = await o.start('shop.charge', { order: 41 });
    const c = await o.claimNext('batch');
    await o.tick(c!.id);
    const shipping = await o.start('shop.ship', { order: 42 });
    const claimed = await o.claimNext('batch');
    const ticking = o.tick(claimed!.id);
    await h.entered();
    const mail = await o.start('shop.mail', { to: 'a@example.com' });
    const base = await serve(t, o);

    const browser = await puppeteer.launch({ executablePath: chromium, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
    t.teardown(() => browser.close());
    const page = await browser.newPage();
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    page.on('console', (m) => {
      if (m.type() === 'error') errors.push(m.text());
    });

    // Overview: counts per pool and status, the failing type.
    await page.goto(`${base}/`);
    t.is(await page.$eval('h1', (e) => e.textContent), 'Overview');
    const overview = await page.$eval('main', (e) => e.textContent ?? '');
    t.true(overview.includes('batch'));
    t.true(overview.includes('shop.charge'));

    // Runs, filtered by status from the form.
    await page.goto(`${base}/runs`);
    await page.select('select[name="status"]', 'failed');
    await Promise.all([page.waitForNavigation(), page.click('form.filters button')]);
    t.true(page.url().includes('status=failed'));
    const listed = await page.$$eval('main tbody tr', (rows) => rows.map((r) => r.textContent ?? ''));
    t.is(listed.length, 1);
    t.true(listed[0]!.includes('shop.charge'));

    // The failed run: its error and its timeline.
    await Promise.all([page.waitForNavigation(), page.click('main tbody tr a.id')]);
    t.true(page.url().endsWith(`/runs/${failed.id}`));
    t.true((await page.$eval('pre.err', (e) => e.textContent ?? '')).includes('card declined: insufficient funds'));
    const timeline = await page.$$eval('td.ev', (cells) => cells.map((c) => c.textContent));
    t.deepEqual(timeline, ['created', 'started', 'step_started', 'step_completed', 'failed']);

    // Cancel the running run from its page.
    await page.goto(`${base}/runs/${shipping.id}`);
    t.is(await page.$eval('dl.row .st', (e) => e.textContent), 'running');
    await Promise.all([page.waitForNavigation(), page.click('button.act-cancel')]);
    t.is(await page.$eval('dl.row .st', (e) => e.textContent), 'canceled');
    t.is((await o.getRun(shipping.id))?.status, 'canceled');
    await ticking;

    // A page updates itself when its run changes elsewhere (no reload).
    await page.goto(`${base}/runs/${mail.id}`);
    t.is(await page.$eval('dl.row .st', (e) => e.textContent), 'pending');
    const loadedAt = await page.evaluate(() => performance.timeOrigin);
    await o.cancel(mail.id);
    // Evaluated in the page (a string: this file is not compiled with the DOM's types).
    await page.waitForFunction("document.querySelector('dl.row .st')?.textContent === 'canceled'", { timeout: 5000 });
    t.is(await page.evaluate(() => performance.timeOrigin), loadedAt, 'the same document: updated in place');
    t.deepEqual(errors, [], 'no script error and no CSP violation');
  });
}
