//! A module built for the previous contract, `wakuwaku:handler@0.2.0`
//! (`wit/handler.wit`), through `wit-bindgen` alone: what a module pinned
//! before event time existed looks like to a host of today. The host must
//! load it and run it unchanged.
//!
//! One event type, `Added` (tag [`ADDED`]), body `{"key": u64, "amount":
//! i64}`, keyed by `key`: `handle` appends each amount to the key's state
//! entry `amounts` (a JSON list, in the order handled) and adds the count
//! to the counter `added`.

use serde::Deserialize;

#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::all)]
mod bindings {
    wit_bindgen::generate!({ path: "../../../wit/handler.wit", world: "module" });
}

use bindings::exports::wakuwaku::handler::handler::{Guest, MessageOrdering};
use bindings::wakuwaku::handler::state;
use bindings::wakuwaku::handler::types::{Algebra, ErrorClass, EventType, HandlerError, ModuleInfo};

/// The tag of `Added`; it collides with none of the other test modules'.
pub const ADDED: u32 = 300;

#[derive(Deserialize)]
struct Added {
    key: u64,
    amount: i64,
}

fn unrecoverable(message: String) -> HandlerError {
    HandlerError { class: ErrorClass::Unrecoverable, message }
}

fn parse(tag: u32, body: &[u8]) -> Result<Added, HandlerError> {
    if tag != ADDED {
        return Err(unrecoverable(format!("no event type with tag {tag}")));
    }
    serde_json::from_slice(body).map_err(|e| unrecoverable(format!("malformed Added body: {e}")))
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

struct Tally;

impl Guest for Tally {
    fn describe() -> ModuleInfo {
        let added = EventType { tag: ADDED, name: "Added".into(), algebra: Algebra::NonAssociative, max_batch: 16 };
        ModuleInfo { event_types: vec![added], emits: Vec::new() }
    }

    fn key(tag: u32, body: Vec<u8>) -> Result<Vec<u8>, HandlerError> {
        Ok(int_key(parse(tag, &body)?.key))
    }

    fn ordering(tag: u32, body: Vec<u8>) -> Result<MessageOrdering, HandlerError> {
        parse(tag, &body)?;
        Ok(MessageOrdering::Relaxed)
    }

    fn combine(_tag: u32, _bodies: Vec<Vec<u8>>) -> Result<Vec<u8>, HandlerError> {
        Err(unrecoverable("Added is not associative".into()))
    }

    fn handle(tag: u32, _key: Vec<u8>, bodies: Vec<Vec<u8>>) -> Result<(), HandlerError> {
        let refused = |refusal: String| unrecoverable(refusal);
        let mut amounts: Vec<i64> = match state::get("amounts").map_err(refused)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| unrecoverable(e.to_string()))?,
            None => Vec::new(),
        };
        for body in &bodies {
            amounts.push(parse(tag, body)?.amount);
        }
        let bytes = serde_json::to_vec(&amounts).map_err(|e| unrecoverable(e.to_string()))?;
        state::set("amounts", &bytes).map_err(refused)?;
        state::counter_add("added", bodies.len() as i64).map_err(refused)
    }
}

bindings::export!(Tally with_types_in bindings);
