//! What the dead-letter topic holds of timers whose `fire` call failed
//! ([`TimerLetter`]): one record per failed call, so that nothing a
//! module was handed is lost without a trace.
//!
//! Rules kept here:
//! - **A letter is no event.** It carries the largest tag,
//!   [`TIMER_LETTER_TAG`] (4294967295, which a module may not declare: a
//!   module declaring it is refused at load, `event-type-tag-reserved`),
//!   and the event type name [`TIMER_EVENT_TYPE`]: `waku dlq list` shows
//!   it, and a re-drive hands it to no handler (counted skipped).
//! - **Its body says everything the call was handed**: the timers in the
//!   order they fired, each with its name, time and payload (as hex), as
//!   JSON.

use serde::Serialize;

use crate::event::EventTypeTag;
use wakuwaku_core::timers::Timer;

/// The tag of a timer's dead letter: no event type's.
pub(super) const TIMER_LETTER_TAG: EventTypeTag = EventTypeTag::new(wakuwaku_core::limits::RESERVED_TAG);

/// The event type a timer's dead letter and its call's trace name.
pub(super) const TIMER_EVENT_TYPE: &str = "timer";

/// The body of a timer's dead letter.
#[derive(Debug, Serialize)]
pub(super) struct TimerLetter {
    timers: Vec<LetterTimer>,
}

/// One timer in a letter.
#[derive(Debug, Serialize)]
struct LetterTimer {
    name: String,
    at: i64,
    payload_hex: String,
}

impl TimerLetter {
    /// The letter of the timers one failed call was handed.
    pub(super) fn of(timers: &[Timer]) -> Self {
        let hex = |bytes: &[u8]| bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        let timers = timers
            .iter()
            .map(|t| LetterTimer { name: t.name.clone(), at: t.at, payload_hex: hex(&t.payload) })
            .collect();
        Self { timers }
    }

    /// Its body.
    pub(super) fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_letter_names_each_timer_with_its_time_and_payload() {
        let timer = Timer { name: "close".into(), at: 5, payload: vec![0, 255] };
        let body = String::from_utf8(TimerLetter::of(&[timer]).to_json()).unwrap();
        assert_eq!(body, r#"{"timers":[{"name":"close","at":5,"payload_hex":"00ff"}]}"#);
    }
}
