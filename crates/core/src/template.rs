//! `{{field}}` key templates. A placeholder names one top-level input
//! field (letters, digits, `_`; no dotted paths); everything else is
//! literal text. Values are rendered the way JS `String(value)` renders
//! them, so keys match the ones the TypeScript system produced.

use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use thiserror::Error;

/// Why a template was refused or rendered no key. Its own type, so this
/// module depends on no other: `JobError` converts it (same codes and
/// messages JS sees).
#[derive(Debug, Clone, Error)]
pub enum TemplateError {
    /// A field the template names is missing or `null` in the input.
    #[error("template '{template}' needs input field '{field}'")]
    MissingField { template: String, field: String },
    /// A `{{` that does not open a valid placeholder.
    #[error("key template '{template}' has {problem}")]
    Malformed { template: String, problem: String },
    /// An input field's JSON could not be read.
    #[error("input field '{field}': {reason}")]
    BadFieldJson { field: String, reason: String },
}

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
    pub fn parse(source: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            }
            let after = &rest[open + 2..];
            let close = after.find("}}").ok_or_else(|| TemplateError::Malformed {
                template: source.to_owned(),
                problem: "an unclosed '{{'".to_owned(),
            })?;
            let field = after[..close].trim();
            if field.is_empty()
                || !field
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err(TemplateError::Malformed {
                    template: source.to_owned(),
                    problem: format!(
                        "placeholder '{{{{{}}}}}': a placeholder names one input field (letters, digits, _)",
                        &after[..close]
                    ),
                });
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
    /// `constructor`) is a `MissingField` error.
    pub fn evaluate(&self, input: &InputFields<'_>) -> Result<String, TemplateError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Field(f) => {
                    let missing = || TemplateError::MissingField {
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
                    let v: Value =
                        serde_json::from_str(text).map_err(|e| TemplateError::BadFieldJson {
                            field: f.clone(),
                            reason: e.to_string(),
                        })?;
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
    // The codes JS sees are the engine error's, converted from ours.
    use crate::error::JobError;

    fn fields(v: serde_json::Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    fn eval(t: &KeyTemplate, v: serde_json::Value) -> Result<String, JobError> {
        let raw = fields(v);
        Ok(t.evaluate(&InputFields::parse(&raw))?)
    }

    fn parse(source: &str) -> Result<KeyTemplate, JobError> {
        Ok(KeyTemplate::parse(source)?)
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
            assert_eq!(parse(bad).unwrap_err().code(), "JOB_INPUT_INVALID", "{bad}");
        }
        assert!(KeyTemplate::parse("plain").is_ok());
    }
}
