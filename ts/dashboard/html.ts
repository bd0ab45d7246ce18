/**
 * HTML for the dashboard: every interpolated value is escaped unless it is
 * markup this module made (`Html`), so a value a user put in a run (a type
 * name, an input, an error, a tag) can never become markup or a script.
 */

/** Markup built by `html` (already escaped where needed). */
export class Html {
  constructor(readonly text: string) {}
  toString(): string {
    return this.text;
  }
}

const ESCAPES: Record<string, string> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;',
  '`': '&#96;',
};

/** Text as HTML text or a quoted attribute value. */
export function esc(v: unknown): string {
  return String(v).replace(/[&<>"'`]/g, (c) => ESCAPES[c] ?? c);
}

function part(v: unknown): string {
  if (v instanceof Html) return v.text;
  if (v === null || v === undefined || v === false) return '';
  if (Array.isArray(v)) return v.map(part).join('');
  return esc(v);
}

/** A template whose `${…}` values are escaped (arrays joined, null/false left out). */
export function html(strings: TemplateStringsArray, ...values: unknown[]): Html {
  let out = strings[0] ?? '';
  for (let i = 0; i < values.length; i++) out += part(values[i]) + (strings[i + 1] ?? '');
  return new Html(out);
}

/** A JSON value, pretty-printed, as escaped text (for a `<pre>`). */
export function json(v: unknown): string {
  if (v === undefined) return '';
  try {
    return JSON.stringify(v, null, 2) ?? '';
  } catch {
    return String(v);
  }
}

/** A date as ISO text, or a dash. */
export function when(d: Date | null | undefined): string {
  return d instanceof Date && !Number.isNaN(d.getTime()) ? d.toISOString().replace('T', ' ').replace('Z', '') : '—';
}
