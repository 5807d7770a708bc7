//! A handler module for the host's own tests. Each event type asks it to do
//! one thing, well or badly, so tests can check what the sandbox and the
//! consumer do about it.

use serde::{Deserialize, Serialize};
use wakuwaku_guest::{Context, ErrorClass, Event, EventTypeTag, Handler, HandlerError, PartitionKey};

/// Every probe event is keyed by a plain number.
#[derive(Hash)]
pub struct ProbeKey(pub u64);

impl PartitionKey for ProbeKey {}

macro_rules! probe_event {
    ($name:ident, $tag:expr, { $($field:ident: $ty:ty),* }) => {
        #[doc = concat!("Probe event `", stringify!($name), "`.")]
        #[derive(Debug, Clone, Serialize, Deserialize)]
        pub struct $name {
            /// The key.
            pub key: u64,
            $(#[allow(missing_docs)] pub $field: $ty,)*
        }

        impl Event for $name {
            const TYPE_TAG: EventTypeTag = EventTypeTag::new($tag);
            const NAME: &'static str = stringify!($name);
            type Key = ProbeKey;

            fn key(&self) -> ProbeKey {
                ProbeKey(self.key)
            }
        }
    };
}

probe_event!(Spin, 1, {});
probe_event!(Hog, 2, { mib: u64 });
probe_event!(Panic, 3, { message: String });
probe_event!(Note, 4, { text: String, emit_to: Option<String> });
probe_event!(Fail, 5, { class: String, message: String });
probe_event!(Recurse, 6, { depth: u64 });

/// The probe module.
pub struct Probe;

impl Handler<Spin> for Probe {
    fn handle(_: &mut Context<'_>, _: &[Spin]) -> Result<(), HandlerError> {
        let mut counter = 0u64;
        loop {
            counter = std::hint::black_box(counter.wrapping_add(1));
        }
    }
}

impl Handler<Hog> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Hog]) -> Result<(), HandlerError> {
        let mut kept = Vec::new();
        for event in events {
            for _ in 0..event.mib {
                kept.push(std::hint::black_box(vec![1u8; 1 << 20]));
            }
        }
        ctx.set("hogged", &kept.len())
    }
}

impl Handler<Panic> for Probe {
    fn handle(_: &mut Context<'_>, events: &[Panic]) -> Result<(), HandlerError> {
        panic!("{}", events[0].message);
    }
}

impl Handler<Note> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Note]) -> Result<(), HandlerError> {
        for note in events {
            ctx.set("last", &note.text)?;
            ctx.counter_add("notes", 1);
            ctx.info(&format!("noted {}", note.text));
            if let Some(topic) = &note.emit_to {
                ctx.emit(topic, &Note { emit_to: None, ..note.clone() })?;
            }
        }
        Ok(())
    }
}

impl Handler<Fail> for Probe {
    fn handle(ctx: &mut Context<'_>, events: &[Fail]) -> Result<(), HandlerError> {
        // Written, then failed: the host must drop this write.
        ctx.set("before-failure", &true)?;
        let event = &events[0];
        let class = match event.class.as_str() {
            "transient" => ErrorClass::Transient,
            "retryable" => ErrorClass::Retryable,
            _ => ErrorClass::Unrecoverable,
        };
        Err(HandlerError::new(class, event.message.clone()))
    }
}

impl Handler<Recurse> for Probe {
    fn handle(_: &mut Context<'_>, events: &[Recurse]) -> Result<(), HandlerError> {
        fn down(depth: u64) -> u64 {
            if depth == 0 { 0 } else { std::hint::black_box(down(depth - 1)) + 1 }
        }
        down(events[0].depth);
        Ok(())
    }
}

wakuwaku_guest::export_module!(Probe: Spin, Hog, Panic, Note, Fail, Recurse);
