//! A module built for the contract before timers, `wakuwaku:handler@0.4.0`
//! (`wit/handler-0.4.wit`), through `wit-bindgen` alone: what a module
//! pinned with `timed-relaxed`, before timers existed, looks like to a
//! host of today. The host must load it and run it unchanged.
//!
//! Two event types, `Ordered` (tag [`ORDERED`], `timed`) and `Shipped`
//! (tag [`SHIPPED`], `timed-relaxed`), body `{"key": u64, "at": i64}`,
//! keyed by `key`, event time `at`: `handle` appends `O@<at>` or `S@<at>`
//! to the key's state entry `seen` (a JSON list, in the order handled).

use serde::Deserialize;

#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::all)]
mod bindings {
    wit_bindgen::generate!({ path: "../../../wit/handler-0.4.wit", world: "module" });
}

use bindings::exports::wakuwaku::handler::handler::{Guest, MessageOrdering};
use bindings::wakuwaku::handler::state;
use bindings::wakuwaku::handler::types::{Algebra, ErrorClass, EventType, HandlerError, ModuleInfo, Timing};

/// The tag of `Ordered`; it collides with none of the other test modules'.
pub const ORDERED: u32 = 320;
/// The tag of `Shipped`.
pub const SHIPPED: u32 = 321;

#[derive(Deserialize)]
struct Seen {
    key: u64,
    at: i64,
}

fn unrecoverable(message: String) -> HandlerError {
    HandlerError { class: ErrorClass::Unrecoverable, message }
}

fn parse(tag: u32, body: &[u8]) -> Result<Seen, HandlerError> {
    if tag != ORDERED && tag != SHIPPED {
        return Err(unrecoverable(format!("no event type with tag {tag}")));
    }
    serde_json::from_slice(body).map_err(|e| unrecoverable(format!("malformed body: {e}")))
}

/// The canonical bytes of an unsigned integer key (`0x01`, then the zigzag
/// form as shortest LEB128), written from the WIT docs.
fn int_key(value: u64) -> Vec<u8> {
    let mut zigzag = u128::from(value) << 1;
    let mut bytes = vec![0x01];
    loop {
        let byte = (zigzag & 0x7f) as u8;
        zigzag >>= 7;
        if zigzag == 0 {
            bytes.push(byte);
            return bytes;
        }
        bytes.push(byte | 0x80);
    }
}

struct SeenModule;

impl Guest for SeenModule {
    fn describe() -> ModuleInfo {
        let timed = |tag, name: &str, timing| EventType {
            tag,
            name: name.into(),
            algebra: Algebra::NonAssociative,
            max_batch: 16,
            timing,
        };
        let event_types =
            vec![timed(ORDERED, "Ordered", Timing::Timed), timed(SHIPPED, "Shipped", Timing::TimedRelaxed)];
        ModuleInfo { event_types, emits: Vec::new() }
    }

    fn key(tag: u32, body: Vec<u8>) -> Result<Vec<u8>, HandlerError> {
        Ok(int_key(parse(tag, &body)?.key))
    }

    fn ordering(tag: u32, body: Vec<u8>) -> Result<MessageOrdering, HandlerError> {
        parse(tag, &body)?;
        Ok(MessageOrdering::Relaxed)
    }

    fn event_time(tag: u32, body: Vec<u8>) -> Result<Option<i64>, HandlerError> {
        Ok(Some(parse(tag, &body)?.at))
    }

    fn combine(_tag: u32, _bodies: Vec<Vec<u8>>) -> Result<Vec<u8>, HandlerError> {
        Err(unrecoverable("no type is associative".into()))
    }

    fn handle(tag: u32, _key: Vec<u8>, bodies: Vec<Vec<u8>>) -> Result<(), HandlerError> {
        let refused = |refusal: String| unrecoverable(refusal);
        let mut seen: Vec<String> = match state::get("seen").map_err(refused)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| unrecoverable(e.to_string()))?,
            None => Vec::new(),
        };
        let letter = if tag == ORDERED { "O" } else { "S" };
        for body in &bodies {
            seen.push(format!("{letter}@{}", parse(tag, body)?.at));
        }
        let bytes = serde_json::to_vec(&seen).map_err(|e| unrecoverable(e.to_string()))?;
        state::set("seen", &bytes).map_err(refused)
    }
}

bindings::export!(SeenModule with_types_in bindings);
