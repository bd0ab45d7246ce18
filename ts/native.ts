/** Loads the napi-rs addon through the generated platform loader. */
// eslint-disable-next-line @typescript-eslint/no-require-imports
const binding = require('../index.js') as typeof import('../index');

export const NativeEngine = binding.NativeEngine;
export type NativeEngine = import('../index').NativeEngine;
export const PgEngine = binding.PgEngine;
export type PgEngine = import('../index').PgEngine;
