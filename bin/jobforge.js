#!/usr/bin/env node
// jobforge command line: `jobforge migrate --url postgres://... [--schema name]`
// creates or upgrades the Postgres schema (idempotent; safe to run while
// workers are up, or from several deploy jobs at once).
'use strict';

const USAGE = `usage: jobforge migrate [--url <postgres url>] [--schema <name>]

  --url     connection string (default: $JOBFORGE_PG_URL, then $DATABASE_URL)
  --schema  schema holding jobforge's tables (default: public)`;

/** Options the command knows: a typo must not silently migrate `public`. */
const OPTIONS = new Set(['url', 'schema']);

function parse(argv) {
  const out = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--help' || a === '-h') out.help = true;
    else if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      const name = eq > 0 ? a.slice(2, eq) : a.slice(2);
      if (!OPTIONS.has(name)) throw new Error(`unknown option --${name}`);
      if (eq > 0) out[name] = a.slice(eq + 1);
      else if (i + 1 < argv.length) out[name] = argv[++i];
      else throw new Error(`${a} needs a value`);
    } else out._.push(a);
  }
  if (out._.length > 1) throw new Error(`unexpected argument ${out._[1]}`);
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
  if (args.help || args._[0] !== 'migrate') {
    console[args.help ? 'log' : 'error'](USAGE);
    return args.help ? 0 : 2;
  }
  const url = args.url || process.env.JOBFORGE_PG_URL || process.env.DATABASE_URL;
  if (!url) {
    console.error(`jobforge: no database: pass --url or set JOBFORGE_PG_URL\n${USAGE}`);
    return 2;
  }
  const { JobOrchestrator } = require('../dist');
  const schema = args.schema || 'public';
  const orch = new JobOrchestrator({ backend: 'postgres', postgres: { url, schema, maxConnections: 1 } });
  try {
    await orch.migrate();
  } finally {
    await orch.close();
  }
  console.log(`jobforge: schema "${schema}" is up to date`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(`jobforge: migrate failed: ${e && e.message ? e.message : e}`);
    process.exit(1);
  },
);
