//! The test host orders a key's timed events as the host does: the README's
//! orders and shipments of one product, both relaxed and `Timed`, reach the
//! handler in event-time order (`event-time-order`); declared
//! `TimedRelaxed`, each type's events form one run and move past the
//! other's as their orderings allow.

use serde::{Deserialize, Serialize};
use wakuwaku_guest::testing::{MemoryHost, Published};
use wakuwaku_guest::{Context, Event, EventTiming, EventTypeTag, Handler, HandlerError};

macro_rules! timed_event {
    ($name:ident, $tag:expr, $timing:expr) => {
        #[derive(Serialize, Deserialize)]
        struct $name {
            product: u64,
            at: i64,
        }

        impl Event for $name {
            const TYPE_TAG: EventTypeTag = EventTypeTag::new($tag);
            const NAME: &'static str = stringify!($name);
            const TIMING: EventTiming = $timing;
            type Key = u64;
            fn key(&self) -> u64 {
                self.product
            }
            fn event_time(&self) -> Option<i64> {
                Some(self.at)
            }
        }

        impl Handler<$name> for Seen {
            fn handle(ctx: &mut Context<'_>, events: &[$name]) -> Result<(), HandlerError> {
                let mut seen: Vec<String> = ctx.get("seen")?.unwrap_or_default();
                seen.extend(events.iter().map(|e| format!("{}@{}", &stringify!($name)[..1], e.at)));
                ctx.set("seen", &seen)
            }
        }
    };
}

/// Appends each event it handles to the product's `seen`, e.g. `O@1000`.
struct Seen;

timed_event!(Ordered, 1, EventTiming::Timed);
timed_event!(Shipped, 2, EventTiming::Timed);
timed_event!(Returned, 3, EventTiming::TimedRelaxed);
timed_event!(Inspected, 4, EventTiming::TimedRelaxed);

wakuwaku_guest::export_module!(Seen: Ordered, Shipped, Returned, Inspected);

fn seen(events: &[Published]) -> Vec<String> {
    let mut host = MemoryHost::new();
    host.handle_in_event_time_order::<Seen>(events).unwrap();
    host.get(&7u64, "seen").unwrap()
}

#[test]
fn a_products_orders_and_shipments_reach_the_handler_in_event_time_order() {
    // As two topics hand them: every order, then every shipment.
    let mut events: Vec<Published> =
        [1000, 3000, 5000].iter().map(|&at| Published::of(&Ordered { product: 7, at }).unwrap()).collect();
    events.extend([2000, 4000, 6000].iter().map(|&at| Published::of(&Shipped { product: 7, at }).unwrap()));
    assert_eq!(seen(&events), ["O@1000", "S@2000", "O@3000", "S@4000", "O@5000", "S@6000"]);
}

#[test]
fn declared_timed_relaxed_each_types_events_form_one_run() {
    let mut events: Vec<Published> =
        [1000, 3000, 5000].iter().map(|&at| Published::of(&Returned { product: 7, at }).unwrap()).collect();
    events.extend([2000, 4000, 6000].iter().map(|&at| Published::of(&Inspected { product: 7, at }).unwrap()));
    assert_eq!(seen(&events), ["R@1000", "R@3000", "R@5000", "I@2000", "I@4000", "I@6000"]);
}
