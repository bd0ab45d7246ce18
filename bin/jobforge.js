#!/usr/bin/env node
// jobforge command line: `jobforge migrate --url postgres://... [--schema name]`
// creates or upgrades the Postgres schema (idempotent; safe to run while
// workers are up, or from several deploy jobs at once); `jobforge dashboard`
// serves the web dashboard of a Postgres database (no worker runs here).
'use strict';

const USAGE = `usage: jobforge migrate [--url <postgres url>] [--schema <name>]
       jobforge dashboard [--url <postgres url>] [--schema <name>] [--port 4000] [--host 127.0.0.1] [--actions] [--multi-tenant]

  --url      connection string (default: $JOBFORGE_PG_URL, then $DATABASE_URL)
  --schema   schema holding jobforge's tables (default: public)
  --port     dashboard: port to listen on (default 4000)
  --host     dashboard: address to listen on (default 127.0.0.1)
  --actions  dashboard: allow cancel, replay, signal and resume (from loopback
             requests only); without it the dashboard is read-only
  --multi-tenant  dashboard: the database's runs belong to tenants; each page
             shows one tenant's, picked with ?tenant=<id> (none: the runs
             without a tenant)`;

/** Options the command knows: a typo must not silently migrate `public`. */
const OPTIONS = new Set(['url', 'schema', 'port', 'host']);
const FLAGS = new Set(['actions', 'multi-tenant']);

function parse(argv) {
  const out = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--help' || a === '-h') out.help = true;
    else if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      const name = eq > 0 ? a.slice(2, eq) : a.slice(2);
      if (FLAGS.has(name) && eq < 0) {
        out[name] = true;
        continue;
      }
      if (!OPTIONS.has(name)) throw new Error(`unknown option --${name}`);
      if (eq > 0) out[name] = a.slice(eq + 1);
      else if (i + 1 < argv.length) out[name] = argv[++i];
      else throw new Error(`${a} needs a value`);
    } else out._.push(a);
  }
  if (out._.length > 1) throw new Error(`unexpected argument ${out._[1]}`);
  // Given empty (`--schema=`, `--url ''`: an unset shell variable), a value
  // must not fall back to its default (`public`, the environment's url).
  for (const name of OPTIONS) {
    if (out[name] === '') throw new Error(`--${name} needs a value`);
  }
  return out;
}

async function main() {
  let args;
  try {
    args = parse(process.argv.slice(2));
  } catch (e) {
    console.error(`jobforge: ${e.message}\n${USAGE}`);
    return 2;
  }
  const command = args._[0];
  if (args.help || (command !== 'migrate' && command !== 'dashboard')) {
    console[args.help ? 'log' : 'error'](USAGE);
    return args.help ? 0 : 2;
  }
  const url = args.url || process.env.JOBFORGE_PG_URL || process.env.DATABASE_URL;
  if (!url) {
    console.error(`jobforge: no database: pass --url or set JOBFORGE_PG_URL\n${USAGE}`);
    return 2;
  }
  const { JobOrchestrator, createDashboard, isLocalRequest } = require('../dist');
  const schema = args.schema || 'public';
  if (command === 'dashboard') return dashboard(args, url, schema, JobOrchestrator, createDashboard, isLocalRequest);
  const orch = new JobOrchestrator({ backend: 'postgres', postgres: { url, schema, maxConnections: 1 } });
  try {
    await orch.migrate();
  } finally {
    await orch.close();
  }
  console.log(`jobforge: schema "${schema}" is up to date`);
  return 0;
}

/** Serves the dashboard until SIGINT/SIGTERM; answers the exit code then. */
async function dashboard(args, url, schema, JobOrchestrator, createDashboard, isLocalRequest) {
  const port = args.port === undefined ? 4000 : Number(args.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`jobforge: --port must be a port number, got ${args.port}\n${USAGE}`);
    return 2;
  }
  const host = args.host || '127.0.0.1';
  const multiTenant = args['multi-tenant'] === true;
  const orch = new JobOrchestrator({ backend: 'postgres', multiTenant, postgres: { url, schema, maxConnections: 4 } });
  // A read answers whether the database and schema are there.
  await orch.countByPoolAndStatus(multiTenant ? null : undefined);
  // Loopback requests by a loopback name only (no DNS rebinding).
  const authorize = args.actions ? (req) => isLocalRequest(req) : undefined;
  const handler = createDashboard(orch, { authorize, title: `jobforge · ${schema}` });
  const server = require('node:http').createServer((req, res) => handler(req, res));
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const addr = server.address();
  console.log(`jobforge: dashboard of schema "${schema}" at http://${host.includes(':') ? `[${host}]` : host}:${addr.port}/ (${args.actions ? 'actions from loopback' : 'read-only'}${multiTenant ? ', multi-tenant: ?tenant=<id>' : ''}; Ctrl-C stops it)`);
  await new Promise((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  server.closeAllConnections?.();
  await new Promise((resolve) => server.close(resolve));
  await orch.close();
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(`jobforge: failed: ${e && e.message ? e.message : e}`);
    process.exit(1);
  },
);
