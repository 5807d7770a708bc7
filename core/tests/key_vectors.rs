//! The shared key test vectors (`key_vectors.json`, beside this file) hold
//! for the core encoding, its text form and the serde serializer. The guest
//! SDK checks its own typed keys against the same file, and so should every
//! other guest language.

use wakuwaku_core::key::Key;
use wakuwaku_core::key_serde::to_key;

#[derive(serde::Deserialize)]
struct Vectors {
    vectors: Vec<Vector>,
    refused: Vec<Refused>,
}

#[derive(serde::Deserialize)]
struct Vector {
    text: String,
    hex: String,
}

#[derive(serde::Deserialize)]
struct Refused {
    hex: String,
    reason: String,
}

fn vectors() -> Vectors {
    serde_json::from_str(include_str!("key_vectors.json")).expect("key_vectors.json parses")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect()
}

#[test]
fn every_vector_encodes_decodes_and_shows_as_its_text() {
    let vectors = vectors().vectors;
    assert!(vectors.len() >= 30, "the file lost its vectors");
    for Vector { text, hex: expected } in vectors {
        let key = Key::parse_text(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(hex(key.as_bytes()), expected, "text {text}");
        let decoded = Key::from_canonical(&unhex(&expected)).unwrap_or_else(|e| panic!("{expected}: {e}"));
        assert_eq!(decoded.to_string(), text, "bytes {expected}");
    }
}

#[test]
fn the_serde_serializer_produces_the_vectors_bytes() {
    let mut checked = 0;
    for Vector { text, hex: expected } in vectors().vectors {
        // A byte string's text form is a JSON object, which serde sees as a
        // map; those vectors are checked through `serialize_bytes` by the
        // SDK's test instead.
        if text.contains("\"bytes\"") {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(hex(to_key(&value).unwrap().as_bytes()), expected, "text {text}");
        checked += 1;
    }
    assert!(checked >= 25);
}

#[test]
fn refused_bytes_are_not_keys() {
    for Refused { hex, reason } in vectors().refused {
        assert!(Key::from_canonical(&unhex(&hex)).is_err(), "{hex} ({reason}) was accepted");
    }
}
