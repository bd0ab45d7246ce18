//! napi-rs binding of jobforge: no orchestration rule lives here.
//!
//! - `engine.rs`: `NativeEngine`, the one class JS holds, over any store;
//! - `ops.rs`: the operations it runs, one list for every store;
//! - `wire.rs`: every format that crosses the boundary (its TS twin is
//!   `ts/wire.ts`);
//! - `bridge.rs`: the threadsafe functions through which the engine
//!   reaches JS (notices, worker batches).

mod bridge;
mod engine;
mod ops;
mod wire;

use napi_derive::napi;

/// The operation names, in the order of their codes (`callSync(code, …)`).
#[napi]
pub fn op_names() -> Vec<String> {
    ops::NAMES.iter().map(|n| camel(n)).collect()
}

/// The run row's fields, in the order of its tuple (`RunRow::to_compact_json`).
#[napi]
pub fn run_fields() -> Vec<String> {
    jobforge_core::RUN_FIELDS
        .iter()
        .map(|f| (*f).to_owned())
        .collect()
}

/// `start_preflight` → `startPreflight`.
fn camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut up = false;
    for c in snake.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}
