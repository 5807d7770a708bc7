//! What a terminal or a log line may receive raw, and how everything else
//! is written: the one rule for showing text a module chose.
//!
//! A module's text (log lines, error messages, the guest's standard error
//! in a trap reason, string keys, state names and values, dead letters)
//! reaches operators through terminals and log files. Shown raw, it could
//! drive the terminal (escape sequences, an OSC window title, BEL), forge
//! lines of the host's own log (a line break, a carriage return), or show
//! text other than what the bytes say (a right-to-left override, a
//! zero-width or otherwise invisible character that makes `\u{feff}good`
//! look like `good`).
//!
//! **The rule.** A character is *hidden*, and is never written raw, when
//! Unicode says it is not a visible glyph of its own: its general category
//! is Cc (controls: C0, DEL, C1), Cf (format: soft hyphen, U+061C, U+FEFF,
//! the bidi embeddings and isolates, tag characters), Zl or Zp (U+2028,
//! U+2029), or it has the Bidi_Control or Default_Ignorable_Code_Point
//! property (variation selectors, U+2060 and its neighbours, Hangul
//! fillers). The properties come from the Unicode data of `icu_properties`,
//! not from a list kept here, so a new Unicode version is a dependency
//! update. Everything else, letters of every script and emoji included, is
//! shown as it is.
//!
//! **The escapes.** [`printable`] writes a hidden character as Rust writes
//! it in a literal (`\n`, `\u{1b}`, `\u{feff}`): plain ASCII, so the result
//! is one line of visible text. [`json_escaped`] writes it as a JSON escape
//! (`\u00ad`, surrogate pairs above the basic plane), so JSON stays JSON.
//! Both leave text without hidden characters untouched (no copy), and both
//! are idempotent: their output holds no hidden character.

use std::borrow::Cow;

use icu_properties::props::{BidiControl, DefaultIgnorableCodePoint, GeneralCategory};
use icu_properties::{CodePointMapData, CodePointSetData};

/// Whether `c` may not reach a terminal or a log line raw (see the module
/// docs for the rule).
pub fn is_hidden(c: char) -> bool {
    // Printable ASCII, what most text is made of, without a lookup.
    if (' '..='~').contains(&c) {
        return false;
    }
    matches!(
        CodePointMapData::<GeneralCategory>::new().get(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    ) || CodePointSetData::new::<BidiControl>().contains(c)
        || CodePointSetData::new::<DefaultIgnorableCodePoint>().contains(c)
}

/// `text` safe to show on a terminal or in a one-line log: every hidden
/// character ([`is_hidden`]) written as its Rust escape (`\u{1b}`, `\r`,
/// `\n`), so a module's text can neither drive the terminal it is shown
/// on, nor forge lines, nor hide characters.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_hidden) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match is_hidden(c) {
            true => shown.extend(c.escape_default()),
            false => shown.push(c),
        }
    }
    Cow::Owned(shown)
}

/// `json` (a JSON text) with every hidden character in it written as a
/// JSON escape (`\uXXXX`, a surrogate pair above the basic plane), except
/// line breaks outside strings, which are the layout of pretty-printed
/// JSON. serde_json escapes only U+0000 to U+001F inside strings, and
/// outside strings JSON holds nothing hidden but whitespace, so the result
/// is the same JSON value.
pub fn json_escaped(json: &str) -> Cow<'_, str> {
    let escapes = |c: char| is_hidden(c) && c != '\n';
    if !json.chars().any(escapes) {
        return Cow::Borrowed(json);
    }
    let mut escaped = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match escapes(c) {
            true => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    escaped.push_str(&format!("\\u{unit:04x}"));
                }
            }
            false => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Characters the rule must cover, each for a reason named beside it.
    const MUST_BE_HIDDEN: &[(char, &str)] = &[
        ('\u{0}', "NUL"),
        ('\u{7}', "BEL"),
        ('\t', "tab"),
        ('\n', "line feed"),
        ('\r', "carriage return"),
        ('\u{1b}', "escape"),
        ('\u{7f}', "DEL"),
        ('\u{85}', "next line (C1)"),
        ('\u{9b}', "CSI (C1)"),
        ('\u{ad}', "soft hyphen"),
        ('\u{34f}', "combining grapheme joiner"),
        ('\u{61c}', "Arabic letter mark"),
        ('\u{115f}', "Hangul choseong filler"),
        ('\u{180e}', "Mongolian vowel separator"),
        ('\u{200b}', "zero width space"),
        ('\u{200d}', "zero width joiner"),
        ('\u{200e}', "left-to-right mark"),
        ('\u{2028}', "line separator"),
        ('\u{2029}', "paragraph separator"),
        ('\u{202e}', "right-to-left override"),
        ('\u{2060}', "word joiner"),
        ('\u{2066}', "left-to-right isolate"),
        ('\u{2069}', "pop directional isolate"),
        ('\u{3164}', "Hangul filler"),
        ('\u{fe00}', "variation selector 1"),
        ('\u{fe0f}', "variation selector 16"),
        ('\u{feff}', "zero width no-break space (BOM)"),
        ('\u{fff9}', "interlinear annotation anchor"),
        ('\u{1d173}', "musical symbol begin beam"),
        ('\u{e0001}', "language tag"),
        ('\u{e0041}', "tag latin capital A"),
        ('\u{e0100}', "variation selector 17"),
        ('\u{e0fff}', "reserved default-ignorable"),
    ];

    /// Visible text of several scripts, which must be shown as it is.
    const MUST_BE_SHOWN: &str = "plain ASCII ~!@#$%^&*()_+{}|:\"<>? ünïcödé 日本語 한국어 עברית العربية हिन्दी ไทย 😀🏳";

    /// The rule, from the Unicode properties, for one code point.
    fn by_definition(c: char) -> bool {
        let category = CodePointMapData::<GeneralCategory>::new().get(c);
        [
            GeneralCategory::Control,
            GeneralCategory::Format,
            GeneralCategory::LineSeparator,
            GeneralCategory::ParagraphSeparator,
        ]
        .contains(&category)
            || CodePointSetData::new::<BidiControl>().contains(c)
            || CodePointSetData::new::<DefaultIgnorableCodePoint>().contains(c)
    }

    #[test]
    fn every_code_point_follows_the_rule_and_escapes_to_visible_ascii() {
        let mut hidden = 0;
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            assert_eq!(is_hidden(c), by_definition(c), "U+{:04X}", u32::from(c));
            let text = c.to_string();
            let shown = printable(&text);
            let json = serde_json::to_string(&text).unwrap();
            let escaped = json_escaped(&json);
            if is_hidden(c) {
                hidden += 1;
                assert!(shown.is_ascii() && !shown.chars().any(is_hidden), "U+{:04X} shows as {shown:?}", u32::from(c));
                assert!(
                    escaped.is_ascii() && !escaped.chars().any(is_hidden),
                    "U+{:04X} as JSON: {escaped}",
                    u32::from(c)
                );
            } else {
                assert_eq!(shown, text, "U+{:04X} is shown as it is", u32::from(c));
                assert_eq!(escaped, json, "U+{:04X} stays in JSON as it is", u32::from(c));
            }
            assert_eq!(serde_json::from_str::<String>(&escaped).unwrap(), text, "U+{:04X} reads back", u32::from(c));
        }
        // Cc alone is 65 code points and the tag block 4 096 more: the
        // properties were read, not defaulted to "visible".
        assert!(hidden > 65 + 4096, "{hidden} hidden code points");
    }

    #[test]
    fn the_characters_an_attacker_uses_are_hidden_and_text_of_every_script_is_not() {
        for &(c, what) in MUST_BE_HIDDEN {
            assert!(is_hidden(c), "{what} (U+{:04X}) is hidden", u32::from(c));
        }
        assert!(matches!(printable(MUST_BE_SHOWN), Cow::Borrowed(_)));
        assert!(matches!(json_escaped(MUST_BE_SHOWN), Cow::Borrowed(_)));
    }

    #[test]
    fn printable_text_is_one_visible_line_and_escaping_is_idempotent() {
        let forged = "a\u{1b}[2Jb\rc\nwaku: forged\u{9b}e\u{202e}f\u{feff}good";
        let shown = printable(forged);
        assert_eq!(shown, "a\\u{1b}[2Jb\\rc\\nwaku: forged\\u{9b}e\\u{202e}f\\u{feff}good");
        assert_eq!(printable(&shown), shown);
    }

    #[test]
    fn json_keeps_its_value_and_its_layout() {
        let value = serde_json::json!({ "\u{feff}good": "x\u{202e}y\u{e0041}\n", "n": [1, 2] });
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        let escaped = json_escaped(&pretty);
        assert!(!escaped.chars().any(|c| is_hidden(c) && c != '\n'), "{escaped}");
        assert!(escaped.contains("\\ufeffgood") && escaped.contains("\\udb40\\udc41"), "{escaped}");
        assert_eq!(escaped.lines().count(), pretty.lines().count());
        assert_eq!(serde_json::from_str::<serde_json::Value>(&escaped).unwrap(), value);
        assert_eq!(json_escaped(&escaped), escaped);
    }
}
