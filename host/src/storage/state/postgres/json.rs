//! The `json` column of `waku_state`: which values are sent beside their
//! bytes as `jsonb` text ([`json_text`]).
//!
//! Rules kept here:
//! - **The host decides, not the server**: a commit sends each value's
//!   JSON text when the value surely is JSON `jsonb` takes, so no row runs
//!   a plpgsql call or a subtransaction (schema version 3).
//! - **Stricter than PostgreSQL, never looser**: where the two readings
//!   differ (a number past `f64`, nesting past 128, a `\u0000`, a number
//!   past `numeric`'s range) the value is kept as bytes with no `json`; a
//!   commit is never refused for it.

/// `value` as the text of a `jsonb` when PostgreSQL surely takes it as one:
/// UTF-8 JSON (serde_json's reading, nested at most 128 deep) with no
/// `\u0000` (which `jsonb` refuses) and no number of more than
/// [`JSON_NUMBER_MAX`] characters or with an exponent past it (`numeric`'s
/// range is smaller than JSON's). Stricter than PostgreSQL where they
/// differ (a number past `f64`, deeper nesting): such a value is kept as
/// bytes with no `json`, never a commit refused.
pub(super) fn json_text(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    serde_json::from_str::<serde_json::Value>(text).ok()?;
    json_numbers_fit(text).then(|| text.to_owned())
}

/// The most characters a JSON number, or the exponent of one, may have for
/// [`json_text`] (`numeric` takes 131 072 digits before the point, 16 383
/// after).
const JSON_NUMBER_MAX: usize = 1000;

/// Whether `text` (valid JSON) has no `\u0000` and every number fits
/// [`JSON_NUMBER_MAX`].
fn json_numbers_fit(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                at += 1;
                while at < bytes.len() && bytes[at] != b'"' {
                    if bytes[at] == b'\\' {
                        if bytes[at + 1..].starts_with(b"u0000") {
                            return false;
                        }
                        at += 1;
                    }
                    at += 1;
                }
                at += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = at;
                while at < bytes.len() && matches!(bytes[at], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    at += 1;
                }
                let number = &text[start..at];
                let exponent = number.find(['e', 'E']).map_or("0", |e| &number[e + 1..]);
                let exponent: i64 = exponent.parse().unwrap_or(i64::MAX);
                if number.len() > JSON_NUMBER_MAX || exponent.unsigned_abs() > JSON_NUMBER_MAX as u64 {
                    return false;
                }
            }
            _ => at += 1,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(text: &str) -> bool {
        json_text(text.as_bytes()).as_deref() == Some(text)
    }

    #[test]
    fn json_text_is_sent_as_it_was_written() {
        for text in [r#"{"a": [1, 2.5, -3e10, true, null, "x\"y"]}"#, r#""\u00e9\ud83d\ude00""#, " 1 ", "1e-400"] {
            assert!(taken(text), "{text:?}");
        }
        assert!(taken(r#""\\u0000""#), "an escaped backslash before u0000 is no NUL");
    }

    #[test]
    fn what_jsonb_may_refuse_is_kept_as_bytes_only() {
        for text in [r#""a\u0000b""#, "[1,]", "{\"a\":1}garbage", "\u{feff}1", "", "1e400"] {
            assert!(json_text(text.as_bytes()).is_none(), "{text:?}");
        }
        assert!(json_text(&[0xff, 0x00]).is_none(), "not UTF-8");
        let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        assert!(taken(&nested(100)) && json_text(nested(200).as_bytes()).is_none(), "nesting past 128");
    }

    #[test]
    fn numbers_are_taken_up_to_the_bound_of_digits_and_of_exponent() {
        // Within `f64` for serde_json, whatever its length.
        let digits = |n: usize| format!("0.{}", "1".repeat(n - 2));
        assert!(taken(&digits(JSON_NUMBER_MAX)));
        assert!(json_text(digits(JSON_NUMBER_MAX + 1).as_bytes()).is_none());
        assert!(taken(&format!("1e-{JSON_NUMBER_MAX}")));
        assert!(json_text(format!("1e-{}", JSON_NUMBER_MAX + 1).as_bytes()).is_none());
        let listed = format!("[\"a \\\"1e-2000\\\" in a string\", {}]", digits(JSON_NUMBER_MAX + 1));
        assert!(json_text(listed.as_bytes()).is_none(), "a number inside an array");
        assert!(taken("[\"a \\\"1e-2000\\\" in a string\", 1]"), "a string is no number");
    }
}
