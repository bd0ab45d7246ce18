/**
 * Starts the example: `PORT` (default 3000) on `HOST` (default 127.0.0.1).
 * SIGTERM / SIGINT close the app: the job worker drains its in-flight runs
 * first, then the process exits by itself (nothing is left running).
 */
import 'reflect-metadata';
import { Logger } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { JOB_RUN_SERVICE, type IJobRunService } from 'jobforge/nest';
import { AppModule } from './app.module';

async function main(): Promise<void> {
  const app = await NestFactory.create(AppModule);
  const port = Number(process.env.PORT ?? 3000);
  const host = process.env.HOST ?? '127.0.0.1';
  await app.listen(port, host);
  console.log(`listening on ${await app.getUrl()}`);

  const logger = new Logger('Shutdown');
  const runs = app.get<IJobRunService>(JOB_RUN_SERVICE);
  const shutdown = async (signal: string) => {
    logger.log(`${signal}: closing; in-flight jobs finish first`);
    await app.close();
    // The in-memory store is still readable: show where every run ended.
    const { items } = await runs.listJobRuns({ limit: 500 });
    console.log(JSON.stringify({ shutdown: signal, runs: items.map((r) => ({ id: r.runId, jobType: r.jobType, status: r.status })) }));
  };
  process.once('SIGTERM', () => void shutdown('SIGTERM'));
  process.once('SIGINT', () => void shutdown('SIGINT'));
}

void main();
