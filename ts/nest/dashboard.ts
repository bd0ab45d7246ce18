/**
 * `JobsModule.forRoot({ dashboard: { path, authorize? } })`: the web
 * dashboard mounted in the Nest application at `path`. Mounted on module
 * init through the HTTP adapter (`app.use(path, handler)`): after the body
 * parser (whose parsed form the dashboard reads) and before Nest's
 * not-found handler, which `app.init()` adds later.
 */
import { Inject, Injectable, Logger, Optional, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { JobInputInvalidError, JobOrchestrator } from '../index';
import { createDashboard, type DashboardAuthorize } from '../dashboard';
import { JOBS_MODULE_OPTIONS, JOBS_ORCHESTRATOR_INSTANCE } from './tokens';

export interface JobsDashboardOptions {
  /** Where the dashboard answers (`'/jobs'`): every path under it is the dashboard's. */
  path: string;
  /**
   * Decides every read and action (see `createDashboard`). Without it the
   * dashboard answers loopback requests only and is read-only.
   */
  authorize?: DashboardAuthorize | undefined;
  title?: string | undefined;
  /** The form token's secret, the same in every replica behind one address. */
  secret?: string | undefined;
}

const KEYS: ReadonlySet<string> = new Set(['path', 'authorize', 'title', 'secret']);

/** The option checked; throws `JobInputInvalidError` naming what is wrong. */
export function checkDashboardOption(d: unknown): JobsDashboardOptions {
  const what = 'JobsModule option dashboard';
  if (d === null || typeof d !== 'object' || Array.isArray(d)) throw new JobInputInvalidError(`${what} must be an object { path, authorize?, title?, secret? }`);
  for (const k of Object.keys(d)) if (!KEYS.has(k)) throw new JobInputInvalidError(`${what} has an unknown key '${k}'`);
  const o = d as Record<string, unknown>;
  if (typeof o.path !== 'string' || !/^\/[^\s?#]*$/.test(o.path) || o.path.replace(/\/+$/, '') === '') {
    throw new JobInputInvalidError(`${what}.path must be a path under '/' such as '/jobs', got ${JSON.stringify(o.path)}`);
  }
  if (o.authorize !== undefined && typeof o.authorize !== 'function') throw new JobInputInvalidError(`${what}.authorize must be a function`);
  if (o.title !== undefined && typeof o.title !== 'string') throw new JobInputInvalidError(`${what}.title must be a string`);
  if (o.secret !== undefined && (typeof o.secret !== 'string' || o.secret.length === 0)) throw new JobInputInvalidError(`${what}.secret must be a non-empty string`);
  return d as JobsDashboardOptions;
}

@Injectable()
export class JobsDashboardMount implements OnModuleInit {
  private readonly logger = new Logger('Jobforge');

  constructor(
    @Inject(JOBS_MODULE_OPTIONS) private readonly options: { dashboard?: JobsDashboardOptions | undefined },
    @Inject(JOBS_ORCHESTRATOR_INSTANCE) private readonly orchestrator: JobOrchestrator,
    @Optional() @Inject(HttpAdapterHost) private readonly host?: HttpAdapterHost,
  ) {}

  onModuleInit(): void {
    if (this.options.dashboard === undefined) return;
    const d = checkDashboardOption(this.options.dashboard);
    const adapter = this.host?.httpAdapter;
    if (!adapter) {
      // An application context without HTTP (a worker process): nothing to mount on.
      this.logger.warn(`dashboard not mounted at ${d.path}: this application has no HTTP server`);
      return;
    }
    const type = typeof adapter.getType === 'function' ? adapter.getType() : 'unknown';
    if (type !== 'express') {
      throw new JobInputInvalidError(
        `JobsModule option dashboard mounts on the Express platform; this application uses '${type}': mount createDashboard(orchestrator, { basePath }) as a route or middleware of it instead`,
      );
    }
    const path = d.path.replace(/\/+$/, '');
    const handler = createDashboard(this.orchestrator, { basePath: path, authorize: d.authorize, title: d.title, secret: d.secret });
    adapter.use(path, handler);
  }
}
