//! The naming rules of topics and projections: the one place the host, its
//! logs, its command line and the guest SDK learn what a name may be.
//!
//! Rules kept here:
//! - **A topic name** is 1 to [`MAX_TOPIC_NAME_BYTES`] bytes of ASCII
//!   letters, digits, `.`, `_` and `-` ([`check_topic_name`]). That keeps
//!   the embedded log's table names unambiguous and every name safe to
//!   print and to use as a file or URL part.
//! - **A projection name** follows its own rule ([`check_projection_name`]),
//!   today the same as a topic's: a projection names a state file, a
//!   rebuild folder, a PostgreSQL schema's rows and a consumer of the log,
//!   all of which a topic's rule keeps safe. It is a function of its own
//!   so that the two rules can diverge without hunting for callers.
//! - **A refusal names the rule broken** ([`NameError`]): empty, too long
//!   (with the length and the bound), or a character outside the allowed
//!   set (with its position). Its message is short and lower-case, for the
//!   caller to put after the name.
//! - **The rules are `const fn`**, so the guest SDK can check a module's
//!   declared topics at compile time with the same rule
//!   ([`crate::limits::is_topic_name`]).

use crate::limits::MAX_TOPIC_NAME_BYTES;

/// The longest projection name, in bytes: a topic name's bound, since a
/// projection's rule is a topic's today.
pub const MAX_PROJECTION_NAME_BYTES: usize = MAX_TOPIC_NAME_BYTES;

/// The characters a topic or projection name may hold, as a refusal says.
const NAME_CHARACTERS: &str = "ASCII letters, digits, '.', '_' and '-'";

/// Which naming rule a name breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("it is empty")]
    Empty,
    /// The name is longer than the bound.
    #[error("it is longer than {max} bytes")]
    TooLong {
        /// The name's length, in bytes.
        bytes: usize,
        /// The longest name allowed, in bytes.
        max: usize,
    },
    /// The name holds a byte outside the allowed characters.
    #[error("only {allowed} are allowed")]
    Character {
        /// The offset of the first such byte.
        at: usize,
        /// The characters allowed, as words.
        allowed: &'static str,
    },
}

/// Checks that `name` is 1 to `max` bytes of ASCII letters, digits, `.`,
/// `_` and `-`.
const fn check_name(name: &str, max: usize) -> Result<(), NameError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err(NameError::Empty);
    }
    if bytes.len() > max {
        return Err(NameError::TooLong { bytes: bytes.len(), max });
    }
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if !(byte.is_ascii_alphanumeric() || byte == b'.' || byte == b'_' || byte == b'-') {
            return Err(NameError::Character { at, allowed: NAME_CHARACTERS });
        }
        at += 1;
    }
    Ok(())
}

/// Checks `topic` against the topic-name rule: 1 to
/// [`MAX_TOPIC_NAME_BYTES`] bytes of ASCII letters, digits, `.`, `_` and
/// `-`.
pub const fn check_topic_name(topic: &str) -> Result<(), NameError> {
    check_name(topic, MAX_TOPIC_NAME_BYTES)
}

/// Checks `projection` against the projection-name rule: today the topic
/// rule (1 to [`MAX_PROJECTION_NAME_BYTES`] bytes of ASCII letters, digits,
/// `.`, `_` and `-`), kept apart so that it can diverge.
pub const fn check_projection_name(projection: &str) -> Result<(), NameError> {
    check_name(projection, MAX_PROJECTION_NAME_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_names_its_rule_and_keeps_its_message() {
        assert_eq!(check_topic_name(""), Err(NameError::Empty));
        assert_eq!(check_topic_name("").unwrap_err().to_string(), "it is empty");
        let long = "x".repeat(MAX_TOPIC_NAME_BYTES + 1);
        assert_eq!(check_topic_name(&long), Err(NameError::TooLong { bytes: 256, max: 255 }));
        assert_eq!(check_topic_name(&long).unwrap_err().to_string(), "it is longer than 255 bytes");
        let refusal = check_topic_name("a b").unwrap_err();
        assert_eq!(refusal, NameError::Character { at: 1, allowed: NAME_CHARACTERS });
        assert_eq!(refusal.to_string(), "only ASCII letters, digits, '.', '_' and '-' are allowed");
        // A multi-byte character is refused at its first byte.
        assert!(matches!(check_topic_name("aé"), Err(NameError::Character { at: 1, .. })));
        for bad in ["a/b", "log\n", "a:b", "~", "é"] {
            assert!(matches!(check_topic_name(bad), Err(NameError::Character { .. })), "{bad:?}");
        }
    }

    #[test]
    fn names_up_to_the_bound_of_the_allowed_characters_pass() {
        assert_eq!(check_topic_name(&"x".repeat(MAX_TOPIC_NAME_BYTES)), Ok(()));
        assert_eq!(check_topic_name("a"), Ok(()));
        assert_eq!(check_topic_name("Bank.accounts_v2-eu"), Ok(()));
        assert_eq!(check_topic_name("retry_bank"), Ok(()), "the host's own topics follow the rule too");
    }

    #[test]
    fn a_projection_name_follows_the_topic_rule_today() {
        assert_eq!(MAX_PROJECTION_NAME_BYTES, MAX_TOPIC_NAME_BYTES);
        let long = "p".repeat(MAX_PROJECTION_NAME_BYTES + 1);
        let bound = "p".repeat(MAX_PROJECTION_NAME_BYTES);
        for name in ["", "bank", "a b", "../x", long.as_str(), bound.as_str()] {
            assert_eq!(check_projection_name(name), check_topic_name(name), "{name:?}");
        }
        assert_eq!(check_projection_name(&bound), Ok(()));
        assert_eq!(check_projection_name("../x"), Err(NameError::Character { at: 2, allowed: NAME_CHARACTERS }));
    }

    // The rules hold in const context (the guest SDK checks a module's
    // declared topics at compile time): this fails to compile otherwise.
    const _: () = assert!(check_topic_name("out").is_ok() && check_topic_name("a b").is_err());
}
