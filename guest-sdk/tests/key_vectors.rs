//! The SDK's typed keys produce the bytes of the shared test vectors
//! (`core/tests/key_vectors.json`): what a Rust author writes as a key type
//! has exactly the bytes every other guest language must produce.

use std::collections::BTreeMap;

use serde::Serialize;
use wakuwaku_guest::PartitionKey;

#[derive(serde::Deserialize)]
struct Vectors {
    vectors: Vec<Vector>,
}

#[derive(serde::Deserialize)]
struct Vector {
    text: String,
    hex: String,
}

/// The vectors' bytes by text form.
fn vectors() -> BTreeMap<String, String> {
    let file: Vectors = serde_json::from_str(include_str!("../../core/tests/key_vectors.json")).unwrap();
    file.vectors.into_iter().map(|v| (v.text, v.hex)).collect()
}

fn hex(key: &impl PartitionKey) -> String {
    key.to_key().unwrap().as_bytes().iter().map(|byte| format!("{byte:02x}")).collect()
}

#[derive(Serialize)]
struct AccountId(u64);
impl PartitionKey for AccountId {}

#[derive(Serialize)]
struct Delta(i32);
impl PartitionKey for Delta {}

#[derive(Serialize)]
struct Holding {
    account: u64,
    currency: &'static str,
}
impl PartitionKey for Holding {}

#[derive(Serialize)]
struct Blob(#[serde(with = "bytes")] Vec<u8>);
impl PartitionKey for Blob {}

#[derive(Serialize)]
struct Nested(((u8, u8), &'static str));
impl PartitionKey for Nested {}

#[derive(Serialize)]
struct Mixed(i8, Blob, char, (u16,));
impl PartitionKey for Mixed {}

#[derive(Serialize)]
struct Empty;
impl PartitionKey for Empty {}

/// `serialize_bytes` without a dependency on `serde_bytes`.
mod bytes {
    pub fn serialize<S: serde::Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(value)
    }
}

#[test]
fn typed_keys_have_the_vectors_bytes() {
    let vectors = vectors();
    let cases: Vec<(&str, String)> = vec![
        ("0", hex(&0u8)),
        ("1", hex(&true)),
        ("-1", hex(&-1i8)),
        ("42", hex(&AccountId(42))),
        ("42", hex(&42u16)),
        ("-300", hex(&Delta(-300))),
        ("2147483647", hex(&i32::MAX)),
        ("-2147483648", hex(&Delta(i32::MIN))),
        ("4294967296", hex(&(1u64 << 32))),
        ("9223372036854775807", hex(&i64::MAX)),
        ("-9223372036854775808", hex(&i64::MIN)),
        ("18446744073709551615", hex(&u64::MAX)),
        ("18446744073709551615", hex(&u128::from(u64::MAX))),
        (r#""""#, hex(&"")),
        (r#""ann""#, hex(&"ann".to_owned())),
        (r#""é""#, hex(&'é')),
        (r#""日本""#, hex(&"日本")),
        (r#"{"bytes":""}"#, hex(&Blob(vec![]))),
        (r#"{"bytes":"00ff"}"#, hex(&Blob(vec![0, 0xff]))),
        ("[]", hex(&Empty)),
        ("[42]", hex(&(42u8,))),
        (r#"[42,"eur"]"#, hex(&Holding { account: 42, currency: "eur" })),
        (r#"[42,"eur"]"#, hex(&(42u64, "eur"))),
        (r#"[[1,2],"a"]"#, hex(&Nested(((1, 2), "a")))),
        (r#"[-1,{"bytes":"ab"},"z",[0]]"#, hex(&Mixed(-1, Blob(vec![0xab]), 'z', (0,)))),
    ];
    for (text, actual) in cases {
        let expected = vectors.get(text).unwrap_or_else(|| panic!("no vector for {text}"));
        assert_eq!(&actual, expected, "key {text}");
    }
}
