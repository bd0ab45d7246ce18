/**
 * JSON checks for run inputs and handler/step outputs. The engine stores
 * JSON text; anything JSON cannot represent faithfully (functions,
 * symbols, BigInt, cycles, NaN/Infinity, class instances other than Date)
 * is rejected instead of being silently dropped or mangled.
 */

/** Deepest nesting of arrays/objects accepted in an input or output. */
export const MAX_JSON_DEPTH = 1000;

/** Returns why `value` is not a JSON value, or null when it is. */
export function jsonProblem(value: unknown): string | null {
  // The containers on the current path (cycle check): a plain stack is
  // cheaper than a Set for the shallow values jobs usually carry.
  const seen: object[] = [];
  let depth = 0;
  const walk = (v: unknown, path: string): string | null => {
    switch (typeof v) {
      case 'string':
      case 'boolean':
        return null;
      case 'number':
        return Number.isFinite(v) ? null : `${path} is ${v}, which JSON cannot represent`;
      case 'undefined':
        // JSON drops undefined properties and writes null in arrays.
        return null;
      case 'bigint':
        return `${path} is a BigInt`;
      case 'symbol':
        return `${path} is a symbol`;
      case 'function':
        return `${path} is a function`;
      case 'object': {
        if (v === null) return null;
        if (v instanceof Date) {
          // Only a genuine Date with the built-in toJSON (an ISO string).
          let t = NaN;
          try {
            t = Date.prototype.getTime.call(v);
          } catch {
            return `${path} is not a genuine Date`;
          }
          if (Number.isNaN(t)) return `${path} is an invalid Date`;
          if ((v as { toJSON?: unknown }).toJSON !== Date.prototype.toJSON) return `${path} is a Date with its own toJSON`;
          return null;
        }
        if (seen.includes(v)) return `${path} is a cyclic reference`;
        if (depth >= MAX_JSON_DEPTH) return `value nests deeper than ${MAX_JSON_DEPTH} levels`;
        const proto = Object.getPrototypeOf(v);
        const isArray = Array.isArray(v);
        if (!isArray && proto !== Object.prototype && proto !== null) {
          const name = (v as object).constructor?.name ?? 'object';
          return `${path} is a ${name} instance, not a plain object`;
        }
        seen.push(v);
        depth++;
        if (isArray) {
          const a = v as unknown[];
          for (let i = 0; i < a.length; i++) {
            const p = walk(a[i], `${path}[${i}]`);
            if (p) return p;
          }
        } else {
          for (const k of Object.keys(v)) {
            const p = walk((v as Record<string, unknown>)[k], `${path}.${k}`);
            if (p) return p;
          }
        }
        seen.pop();
        depth--;
        return null;
      }
      default:
        return `${path} has unsupported type ${typeof v}`;
    }
  };
  return walk(value, 'value');
}

/** JSON text of `value` after checking it, or the reason it is not JSON. */
export function toJsonText(value: unknown, what: string): { ok: true; text: string } | { ok: false; reason: string } {
  const problem = jsonProblem(value);
  if (problem) return { ok: false, reason: problem.replace(/^value/, what) };
  try {
    return { ok: true, text: JSON.stringify(value) ?? 'null' };
  } catch (e) {
    return { ok: false, reason: `${what}: ${(e as Error).message}` };
  }
}
