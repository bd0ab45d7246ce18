/** Loads the napi-rs addon through the generated platform loader. */
import { checkRunFields } from './wire';

// eslint-disable-next-line @typescript-eslint/no-require-imports
const binding = require('../index.js') as typeof import('../index');

/**
 * napi-rs declares an `Option<T>` field as `field?: T`; the addon reads
 * `undefined` as None just the same, which `exactOptionalPropertyTypes`
 * needs the type to say.
 */
type Loose<T> = { [K in keyof T]: T[K] | undefined };
type LooseOptions<C> = C extends new (options: infer O, ...rest: infer R) => infer I ? new (options: Loose<O>, ...rest: R) => I : never;

export const NativeEngine = binding.NativeEngine as LooseOptions<typeof binding.NativeEngine>;
export type NativeEngine = import('../index').NativeEngine;

/** The engine's operations this build calls (`ops.rs`'s list). */
const OP_NAMES = [
  'migrate', 'storedJobTypes', 'register', 'definition', 'start', 'startPreflight', 'startMany', 'cancel', 'replay',
  'claimNext', 'beginAttempt', 'finishAttempt', 'attemptLive', 'releaseAttempt', 'expireAttempts', 'stepBegin', 'stepComplete',
  'stepFail', 'findById', 'getRun', 'countRuns', 'listSteps', 'findStep', 'recordStep', 'listForScope', 'cancelForScope',
  'rescheduleForScope', 'countByPoolAndStatus', 'listRecentFailed', 'listJobRuns', 'getRunTree', 'listRunEvents', 'metrics', 'throughput', 'putSchedule',
  'removeSchedule', 'listSchedules', 'fireDueSchedules', 'waitBegin', 'waitDelivered', 'signal', 'resume',
] as const;
export type OpName = (typeof OP_NAMES)[number];

/** Operation codes, read from the addon itself so the two sides cannot drift. */
export const OP: Readonly<Record<OpName, number>> = (() => {
  const names = binding.opNames();
  const codes: Partial<Record<OpName, number>> = {};
  for (const n of OP_NAMES) {
    const i = names.indexOf(n);
    if (i < 0) throw new Error(`jobforge: the native addon has no operation '${n}'; rebuild it`);
    codes[n] = i;
  }
  return codes as Record<OpName, number>;
})();

checkRunFields(binding.runFields());
