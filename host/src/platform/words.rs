//! How counts and rates are written in what the host says to people: the
//! one place that picks a noun's singular or plural form, so no message
//! says `1 events` or `1 batches`.
//!
//! Rules kept here:
//! - A count is written with the noun's singular form for exactly one,
//!   the plural for every other number, zero included (`0 events`).
//! - The plural is English's regular one (`event` → `events`, `batch` →
//!   `batches`, `entry` → `entries`), applied to the last word (`event
//!   type` → `event types`); a noun that is not regular is not given here.
//! - A rate is written so that it never reads `0 events/s` for events that
//!   were consumed: below 10 per second with two significant digits
//!   (`0.067 events/s`), whole numbers above; a time too short to measure
//!   gives no rate at all.

/// `count` and `noun` in the form that count takes: `1 event`, `2 events`,
/// `0 batches`.
pub fn counted(count: impl Into<u64>, noun: &str) -> String {
    let count = count.into();
    match count {
        1 => format!("1 {noun}"),
        _ => format!("{count} {}", plural(noun)),
    }
}

/// The regular English plural of `noun` (its last word).
pub fn plural(noun: &str) -> String {
    if let Some(stem) = noun.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        return format!("{stem}ies");
    }
    match noun.ends_with(['s', 'x', 'z']) || noun.ends_with("ch") || noun.ends_with("sh") {
        true => format!("{noun}es"),
        false => format!("{noun}s"),
    }
}

/// `count` `noun`s in `secs` as a rate (`12 events/s`, `0.067 events/s`);
/// `None` when `secs` is too short to measure (under a millisecond).
pub fn per_second(count: u64, secs: f64, noun: &str) -> Option<String> {
    // NaN compares false, so it is refused too.
    if secs.is_nan() || secs < 1e-3 {
        return None;
    }
    let rate = count as f64 / secs;
    let shown = match rate {
        0.0 => "0".to_owned(),
        rate if rate >= 10.0 => format!("{rate:.0}"),
        // Two significant digits.
        rate => {
            let decimals = (1 - rate.log10().floor() as i32).max(0) as usize;
            format!("{rate:.decimals$}")
        }
    };
    Some(format!("{shown} {}/s", plural(noun)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(counted(1u64, "event"), "1 event");
        assert_eq!(counted(0u64, "event"), "0 events");
        assert_eq!(counted(2u32, "batch"), "2 batches");
        assert_eq!(counted(1u32, "batch"), "1 batch");
        assert_eq!(counted(3u64, "event type"), "3 event types");
        assert_eq!(counted(1u64, "event type"), "1 event type");
        assert_eq!(counted(5u64, "entry"), "5 entries");
        assert_eq!(counted(5u64, "key"), "5 keys");
        assert_eq!(counted(2u64, "dead letter"), "2 dead letters");
    }

    #[test]
    fn a_rate_of_few_events_is_not_rounded_to_zero() {
        assert_eq!(per_second(4, 60.0, "event").as_deref(), Some("0.067 events/s"));
        assert_eq!(per_second(4, 1.0, "event").as_deref(), Some("4.0 events/s"));
        assert_eq!(per_second(1_000, 2.0, "event").as_deref(), Some("500 events/s"));
        assert_eq!(per_second(0, 2.0, "event").as_deref(), Some("0 events/s"));
        assert_eq!(per_second(4, 0.0, "event"), None);
        assert_eq!(per_second(4, f64::NAN, "event"), None);
    }
}
