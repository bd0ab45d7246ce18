/**
 * Compile-time checks of `JobStoreError` (issue 24): what a failed
 * database call says it changed. Run by `npm run test:types`; nothing here
 * is executed.
 */
import { JobStoreError } from '../../dist';
import { JobStoreError as NestJobStoreError } from '../../dist/nest';

/** Exact type equality (not mere assignability). */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function same<A, B>(ok: Equal<A, B>): void {
  void ok;
}

export function whatChanged(e: unknown): 'retry' | 'read back' | 'give up' | null {
  if (!(e instanceof JobStoreError)) return null;
  same<typeof e.outcome, 'none' | 'unknown'>(true);
  same<typeof e.retryable, boolean>(true);
  same<typeof e.code, 'JOB_STORE_ERROR'>(true);
  if (e.outcome === 'unknown') return 'read back';
  return e.retryable ? 'retry' : 'give up';
}

// The Nest entry point re-exports the same class.
same<NestJobStoreError, JobStoreError>(true);
// Built without an outcome, nothing changed (as before the field existed).
export const plain: 'none' | 'unknown' = new JobStoreError('m', true).outcome;
