//! `{{field}}` key templates. A placeholder names one top-level input
//! field (letters, digits, `_`; no dotted paths); everything else is
//! literal text. Values are rendered the way JS `String(value)` renders
//! them, so keys match the ones the TypeScript system produced.

use crate::error::{JobError, Result};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;

/// The input's own top-level fields, each left as raw JSON text so that a
/// deeply nested input costs nothing beyond the fields a template reads.
pub struct InputFields<'a>(HashMap<String, &'a RawValue>);

impl<'a> InputFields<'a> {
    /// Any JSON that is not an object has no fields.
    pub fn parse(input: &'a RawValue) -> Self {
        InputFields(serde_json::from_str(input.get()).unwrap_or_default())
    }

    fn get(&self, field: &str) -> Option<&'a RawValue> {
        self.0.get(field).copied()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Field(String),
}

#[derive(Debug, Clone)]
pub struct KeyTemplate {
    source: String,
    parts: Vec<Part>,
}

impl KeyTemplate {
    /// Parses a template. A `{{` that does not open a valid placeholder is
    /// rejected so a typo cannot silently become a constant key.
    pub fn parse(source: &str) -> Result<Self> {
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            }
            let after = &rest[open + 2..];
            let close = after.find("}}").ok_or_else(|| {
                JobError::invalid(format!("key template '{source}' has an unclosed '{{{{'"))
            })?;
            let field = after[..close].trim();
            if field.is_empty()
                || !field
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err(JobError::invalid(format!(
                    "key template '{source}' has placeholder '{{{{{}}}}}': a placeholder names one input field (letters, digits, _)",
                    &after[..close]
                )));
            }
            parts.push(Part::Field(field.to_owned()));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        Ok(KeyTemplate {
            source: source.to_owned(),
            parts,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the key. A field that is missing or `null` in the input (only
    /// the input's own fields count, never inherited ones such as
    /// `constructor`) is a `JobTemplateFieldMissing` error.
    pub fn evaluate(&self, input: &InputFields<'_>) -> Result<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Field(f) => {
                    let missing = || JobError::JobTemplateFieldMissing {
                        template: self.source.clone(),
                        field: f.clone(),
                    };
                    let raw = input.get(f).ok_or_else(missing)?;
                    let text = raw.get().trim_start();
                    if text.starts_with('{') {
                        // Any object renders as String({}) does.
                        out.push_str("[object Object]");
                        continue;
                    }
                    let v: Value = serde_json::from_str(text)
                        .map_err(|e| JobError::invalid(format!("input field '{f}': {e}")))?;
                    if v.is_null() {
                        return Err(missing());
                    }
                    js_string(&v, &mut out);
                }
            }
        }
        Ok(out)
    }
}

/// JS `String(value)` for a JSON value.
fn js_string(v: &Value, out: &mut String) {
    match v {
        Value::Null => {}
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::String(s) => out.push_str(s),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&js_number(u as f64));
            } else if let Some(f) = n.as_f64() {
                out.push_str(&js_number(f));
            }
        }
        // Array.prototype.toString joins elements; null becomes "".
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                js_string(item, out);
            }
        }
        Value::Object(_) => out.push_str("[object Object]"),
    }
}

/// JS Number-to-String for finite doubles (JSON has no NaN/Infinity).
fn js_number(f: f64) -> String {
    if f == 0.0 {
        return "0".to_owned();
    }
    if f.fract() == 0.0 && f.abs() < 1e21 {
        return format!("{f:.0}");
    }
    let abs = f.abs();
    if (1e-6..1e21).contains(&abs) {
        return format!("{f}");
    }
    // Exponent form: Rust prints `1e21`, JS prints `1e+21`.
    let s = format!("{f:e}");
    match s.split_once('e') {
        Some((mant, exp)) if !exp.starts_with('-') => format!("{mant}e+{exp}"),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: serde_json::Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    fn eval(t: &KeyTemplate, v: serde_json::Value) -> Result<String> {
        let raw = fields(v);
        t.evaluate(&InputFields::parse(&raw))
    }
    use serde_json::json;

    #[test]
    fn renders_fields_like_js_string() {
        let t = KeyTemplate::parse("acct:{{ id }}/{{n}}/{{b}}/{{a}}").unwrap();
        let key = eval(
            &t,
            json!({"id": "x", "n": 1.5, "b": true, "a": [1, null, "z"]}),
        )
        .unwrap();
        assert_eq!(key, "acct:x/1.5/true/1,,z");
        let t = KeyTemplate::parse("{{n}}").unwrap();
        assert_eq!(eval(&t, json!({"n": 1e21})).unwrap(), "1e+21");
        assert_eq!(eval(&t, json!({"n": 42})).unwrap(), "42");
        assert_eq!(eval(&t, json!({"n": {"k": 1}})).unwrap(), "[object Object]");
    }

    #[test]
    fn missing_null_and_inherited_fields_are_errors() {
        let t = KeyTemplate::parse("{{constructor}}").unwrap();
        let err = eval(&t, json!({})).unwrap_err();
        assert_eq!(err.code(), "JOB_TEMPLATE_FIELD_MISSING");
        let t = KeyTemplate::parse("{{a}}").unwrap();
        assert!(eval(&t, json!({"a": null})).is_err());
        assert!(eval(&t, json!(5)).is_err());
    }

    #[test]
    fn malformed_placeholders_are_rejected() {
        for bad in ["{{a.b}}", "{{}}", "x{{a", "{{ a-b }}"] {
            assert_eq!(
                KeyTemplate::parse(bad).unwrap_err().code(),
                "JOB_INPUT_INVALID",
                "{bad}"
            );
        }
        assert!(KeyTemplate::parse("plain").is_ok());
    }
}
