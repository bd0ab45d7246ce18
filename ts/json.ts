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
        // JSON.stringify would write what toJSON returns, unchecked (an
        // array's own toJSON, a non-enumerable one, escaped the walk below).
        if (typeof (v as { toJSON?: unknown }).toJSON === 'function') return `${path} has its own toJSON`;
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

/**
 * A plain object whose values are all strings, finite numbers, booleans or
 * null: the shape most job inputs have. Checked without the general walk's
 * allocations (its path strings and cycle stack).
 */
function isFlatJsonObject(v: unknown): boolean {
  if (typeof v !== 'object' || v === null || Object.getPrototypeOf(v) !== Object.prototype) return false;
  const o = v as Record<string, unknown>;
  // A hidden (non-enumerable) toJSON: JSON would write what it returns; the full walk refuses it.
  if (typeof o.toJSON === 'function') return false;
  for (const k in o) if (!isFlatJsonValue(o[k])) return false;
  return true;
}

/** A string, a finite number other than -0, a boolean or null. */
function isFlatJsonValue(x: unknown): boolean {
  switch (typeof x) {
    case 'string':
    case 'boolean':
      return true;
    case 'number':
      // -0 is excluded: JSON writes it as 0, a copy would keep the sign.
      return Number.isFinite(x) && (x !== 0 || 1 / x > 0);
    case 'object':
      return x === null;
    default:
      return false;
  }
}

/** A flat object's JSON text and a copy of it (what `JSON.parse(text)` gives). */
export interface FlatSnapshot {
  text: string;
  copy: Record<string, unknown>;
}

/**
 * The JSON text of a flat object (see `isFlatJsonObject`) and a copy of
 * it (what `JSON.parse(text)` gives); null for any other value, and for
 * the rare flat object with an inherited enumerable key or an own
 * `__proto__`, which then take the general path. Each property is read
 * once, into the copy, and the text is written from the copy: a getter
 * cannot make the two differ.
 */
export function flatSnapshot(value: unknown): FlatSnapshot | null {
  if (typeof value !== 'object' || value === null || Object.getPrototypeOf(value) !== Object.prototype) return null;
  const o = value as Record<string, unknown>;
  const copy: Record<string, unknown> = {};
  for (const k in o) {
    // JSON writes own keys only; assigning '__proto__' would set the copy's prototype.
    if (k === '__proto__' || !Object.prototype.hasOwnProperty.call(o, k)) return null;
    const x = o[k];
    if (!isFlatJsonValue(x)) return null;
    copy[k] = x;
  }
  return { text: JSON.stringify(copy), copy };
}

/** JSON text of `value` after checking it, or the reason it is not JSON. */
export function toJsonText(value: unknown, what: string): { ok: true; text: string } | { ok: false; reason: string } {
  let problem: string | null;
  try {
    if (isFlatJsonObject(value)) return { ok: true, text: JSON.stringify(value) };
    problem = jsonProblem(value);
  } catch (e) {
    // A getter or a proxy's trap threw while the value was read.
    let why = 'reading it threw';
    try {
      why = `reading it threw: ${e instanceof Error ? e.message : String(e)}`;
    } catch {
      // what it threw cannot be printed either
    }
    return { ok: false, reason: `${what} cannot be read (${why})` };
  }
  if (problem) return { ok: false, reason: problem.replace(/^value/, what) };
  try {
    return { ok: true, text: JSON.stringify(value) ?? 'null' };
  } catch (e) {
    return { ok: false, reason: `${what}: ${(e as Error).message}` };
  }
}
