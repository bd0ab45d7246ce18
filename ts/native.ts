/** Loads the napi-rs addon through the generated platform loader. */
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
export const PgEngine = binding.PgEngine as LooseOptions<typeof binding.PgEngine>;
export type PgEngine = import('../index').PgEngine;
