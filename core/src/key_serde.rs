//! Keys from serde: any `Serialize` value whose shape is a key becomes its
//! canonical bytes ([`to_key`]).
//!
//! This is how the Rust guest SDK turns an author's key type into the bytes
//! the `key` export returns, so that `#[derive(Serialize)] struct
//! AccountId(u64)` has exactly the bytes of `42u64`, and of the integer 42
//! in any other guest language.
//!
//! How each serde shape maps onto a [`KeyValue`]:
//!
//! | serde shape | key value |
//! | --- | --- |
//! | integers of every width (`i128`/`u128` only from `i64::MIN` to `u64::MAX`) | integer |
//! | `bool` | integer 0 or 1 |
//! | `char`, `str` | string |
//! | bytes (`serialize_bytes`, e.g. `serde_bytes::ByteBuf`) | byte string |
//! | newtype struct | the value inside (transparent) |
//! | tuple, tuple struct, struct (its fields in order), sequence | tuple |
//! | unit, unit struct | the empty tuple |
//! | unit enum variant | its name, as a string |
//!
//! Refused, with [`KeyError::NotAKey`] naming the shape: floats (no
//! canonical form: `0.1 + 0.2`), maps (no canonical order), options (an
//! absent key is no key), and enum variants that carry data. Note that a
//! `Vec<u8>` serializes as a sequence, so it is a tuple of integers; use
//! `serde_bytes` for a byte string.
//!
//! Limits are checked while serializing: a value longer than
//! [`MAX_KEY_BYTES`] or nested deeper than [`MAX_KEY_DEPTH`] is refused
//! before it is built in full.

use serde::ser::{self, Serialize};

use crate::key::{Key, KeyError, KeyValue, MAX_KEY_BYTES, MAX_KEY_DEPTH};

/// The key of a serializable value; see the module docs for which shapes
/// are keys.
///
/// ```
/// use serde::Serialize;
/// use wakuwaku_core::key::Key;
/// use wakuwaku_core::key_serde::to_key;
///
/// #[derive(Serialize)]
/// struct AccountId(u64);
///
/// #[derive(Serialize)]
/// struct Holding {
///     account: u64,
///     currency: String,
/// }
///
/// assert_eq!(to_key(&AccountId(42)).unwrap(), Key::int(42u64));
/// let holding = to_key(&Holding { account: 42, currency: "eur".into() }).unwrap();
/// assert_eq!(holding.to_string(), r#"[42,"eur"]"#);
/// assert!(to_key(&1.5f64).is_err());
/// ```
pub fn to_key<T: Serialize + ?Sized>(value: &T) -> Result<Key, KeyError> {
    let mut encoder = Encoder { size: 0, depth: 0 };
    let value = value.serialize(&mut encoder)?;
    Key::of(&value)
}

fn not_a_key(reason: impl Into<String>) -> KeyError {
    KeyError::NotAKey { reason: reason.into() }
}

impl ser::Error for KeyError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        not_a_key(message.to_string())
    }
}

/// Builds the value, keeping count of its encoded size and depth so that an
/// oversized value fails early.
struct Encoder {
    /// Encoded bytes so far (tuple headers counted as two bytes).
    size: usize,
    /// Tuples open around the value being serialized.
    depth: usize,
}

impl Encoder {
    /// Counts `bytes` more encoded bytes.
    fn grow(&mut self, bytes: usize) -> Result<(), KeyError> {
        self.size = self.size.saturating_add(bytes);
        if self.size > MAX_KEY_BYTES {
            return Err(KeyError::TooLong { length: self.size });
        }
        Ok(())
    }

    fn int(&mut self, value: i128) -> Result<KeyValue, KeyError> {
        if !(i128::from(i64::MIN)..=i128::from(u64::MAX)).contains(&value) {
            return Err(KeyError::IntOutOfRange { at: self.size });
        }
        self.grow(11)?;
        Ok(KeyValue::Int(value))
    }

    fn text(&mut self, text: &str) -> Result<KeyValue, KeyError> {
        self.grow(text.len().saturating_add(3))?;
        Ok(KeyValue::Str(text.to_owned()))
    }

    fn open_tuple(&mut self, len: Option<usize>) -> Result<Tuple<'_>, KeyError> {
        if self.depth >= MAX_KEY_DEPTH {
            return Err(KeyError::TooDeep);
        }
        self.grow(2)?;
        self.depth += 1;
        // Every element takes at least two bytes, so no honest length needs
        // more room than this.
        let capacity = len.unwrap_or(0).min(MAX_KEY_BYTES / 2);
        Ok(Tuple { encoder: self, items: Vec::with_capacity(capacity) })
    }
}

/// A tuple being filled; closes its depth when it ends.
struct Tuple<'a> {
    encoder: &'a mut Encoder,
    items: Vec<KeyValue>,
}

impl Tuple<'_> {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
        let value = value.serialize(&mut *self.encoder)?;
        self.items.push(value);
        Ok(())
    }

    fn close(self) -> Result<KeyValue, KeyError> {
        self.encoder.depth -= 1;
        Ok(KeyValue::Tuple(self.items))
    }
}

macro_rules! ints {
    ($($method:ident: $ty:ty),* $(,)?) => {
        $(fn $method(self, value: $ty) -> Result<KeyValue, KeyError> {
            self.int(i128::from(value))
        })*
    };
}

impl<'a> ser::Serializer for &'a mut Encoder {
    type Ok = KeyValue;
    type Error = KeyError;
    type SerializeSeq = Tuple<'a>;
    type SerializeTuple = Tuple<'a>;
    type SerializeTupleStruct = Tuple<'a>;
    type SerializeTupleVariant = ser::Impossible<KeyValue, KeyError>;
    type SerializeMap = ser::Impossible<KeyValue, KeyError>;
    type SerializeStruct = Tuple<'a>;
    type SerializeStructVariant = ser::Impossible<KeyValue, KeyError>;

    ints!(
        serialize_i8: i8,
        serialize_i16: i16,
        serialize_i32: i32,
        serialize_i64: i64,
        serialize_u8: u8,
        serialize_u16: u16,
        serialize_u32: u32,
        serialize_u64: u64,
    );

    fn serialize_i128(self, value: i128) -> Result<KeyValue, KeyError> {
        self.int(value)
    }

    fn serialize_u128(self, value: u128) -> Result<KeyValue, KeyError> {
        let at = self.size;
        self.int(i128::try_from(value).map_err(|_| KeyError::IntOutOfRange { at })?)
    }

    fn serialize_bool(self, value: bool) -> Result<KeyValue, KeyError> {
        self.int(i128::from(value))
    }

    fn serialize_f32(self, _: f32) -> Result<KeyValue, KeyError> {
        Err(not_a_key("a float (f32) has no canonical form"))
    }

    fn serialize_f64(self, _: f64) -> Result<KeyValue, KeyError> {
        Err(not_a_key("a float (f64) has no canonical form"))
    }

    fn serialize_char(self, value: char) -> Result<KeyValue, KeyError> {
        self.text(value.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, value: &str) -> Result<KeyValue, KeyError> {
        self.text(value)
    }

    fn serialize_bytes(self, value: &[u8]) -> Result<KeyValue, KeyError> {
        self.grow(value.len().saturating_add(3))?;
        Ok(KeyValue::Bytes(value.to_vec()))
    }

    fn serialize_none(self) -> Result<KeyValue, KeyError> {
        Err(not_a_key("an Option (None) is not a key"))
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<KeyValue, KeyError> {
        Err(not_a_key("an Option (Some) is not a key"))
    }

    fn serialize_unit(self) -> Result<KeyValue, KeyError> {
        self.open_tuple(Some(0))?.close()
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<KeyValue, KeyError> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<KeyValue, KeyError> {
        self.text(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<KeyValue, KeyError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        _: u32,
        variant: &'static str,
        _: &T,
    ) -> Result<KeyValue, KeyError> {
        Err(data_variant(name, variant))
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Tuple<'a>, KeyError> {
        self.open_tuple(len)
    }

    fn serialize_tuple(self, len: usize) -> Result<Tuple<'a>, KeyError> {
        self.open_tuple(Some(len))
    }

    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Tuple<'a>, KeyError> {
        self.open_tuple(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, KeyError> {
        Err(data_variant(name, variant))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, KeyError> {
        Err(not_a_key("a map has no canonical order"))
    }

    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Tuple<'a>, KeyError> {
        self.open_tuple(Some(len))
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, KeyError> {
        Err(data_variant(name, variant))
    }
}

fn data_variant(name: &str, variant: &str) -> KeyError {
    not_a_key(format!("enum variant {name}::{variant} carries data (only unit variants are keys)"))
}

/// The compound serializers whose parts are values in order.
macro_rules! tuple_parts {
    ($($trait:ident :: $method:ident),* $(,)?) => {$(
        impl ser::$trait for Tuple<'_> {
            type Ok = KeyValue;
            type Error = KeyError;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
                self.push(value)
            }

            fn end(self) -> Result<KeyValue, KeyError> {
                self.close()
            }
        }
    )*};
}
tuple_parts!(SerializeSeq::serialize_element, SerializeTuple::serialize_element, SerializeTupleStruct::serialize_field);

impl ser::SerializeStruct for Tuple<'_> {
    type Ok = KeyValue;
    type Error = KeyError;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Result<(), KeyError> {
        self.push(value)
    }

    fn end(self) -> Result<KeyValue, KeyError> {
        self.close()
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::*;

    fn text(value: &(impl Serialize + ?Sized)) -> String {
        to_key(value).unwrap().to_string()
    }

    #[derive(Serialize)]
    struct AccountId(u64);

    #[derive(Serialize)]
    struct Holding {
        account: u64,
        currency: &'static str,
        #[serde(skip)]
        _cache: u8,
    }

    #[derive(Serialize)]
    struct Pair(i8, char);

    #[derive(Serialize)]
    struct Global;

    #[derive(Serialize)]
    #[serde(rename_all = "lowercase")]
    enum Region {
        North,
        Other(u8),
        Named { id: u8 },
        Both(u8, u8),
    }

    struct Bytes(&'static [u8]);

    impl Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(self.0)
        }
    }

    #[test]
    fn integers_of_every_width_and_newtypes_share_their_bytes() {
        let forty_two = Key::int(42u64);
        assert_eq!(to_key(&AccountId(42)).unwrap(), forty_two);
        for key in [
            to_key(&42u8),
            to_key(&42u16),
            to_key(&42u32),
            to_key(&42usize),
            to_key(&42u128),
            to_key(&42i8),
            to_key(&42i16),
            to_key(&42i32),
            to_key(&42i64),
            to_key(&42i128),
        ] {
            assert_eq!(key.unwrap(), forty_two);
        }
        assert_eq!(to_key(&u64::MAX).unwrap(), Key::int(u64::MAX));
        assert_eq!(to_key(&i64::MIN).unwrap(), Key::int(i64::MIN));
        assert_eq!(to_key(&true).unwrap(), Key::int(1));
        assert_eq!(to_key(&false).unwrap(), Key::int(0));
    }

    #[test]
    fn strings_bytes_tuples_and_structs() {
        assert_eq!(text("ann"), r#""ann""#);
        assert_eq!(text(&'é'), r#""é""#);
        assert_eq!(text(&Bytes(&[0, 255])), r#"{"bytes":"00ff"}"#);
        assert_eq!(text(&(42u64, "eur")), r#"[42,"eur"]"#);
        assert_eq!(text(&Pair(-1, 'x')), r#"[-1,"x"]"#);
        assert_eq!(text(&Holding { account: 42, currency: "eur", _cache: 9 }), r#"[42,"eur"]"#);
        assert_eq!(
            to_key(&Holding { account: 42, currency: "eur", _cache: 0 }).unwrap(),
            to_key(&(42, "eur")).unwrap()
        );
        assert_eq!(text(&vec![1u8, 2]), "[1,2]", "a Vec<u8> is a sequence, not a byte string");
        assert_eq!(text(&[7u16; 3]), "[7,7,7]");
        assert_eq!(text(&()), "[]");
        assert_eq!(text(&Global), "[]");
        assert_eq!(text(&Region::North), r#""north""#);
        assert_eq!(text(&((1, 2), "a")), r#"[[1,2],"a"]"#);
    }

    #[test]
    fn shapes_without_a_canonical_form_are_refused_by_name() {
        let reason = |value: Result<Key, KeyError>| match value {
            Err(KeyError::NotAKey { reason }) => reason,
            other => panic!("expected NotAKey, got {other:?}"),
        };
        assert!(reason(to_key(&1.5f64)).contains("float (f64)"));
        assert!(reason(to_key(&1.5f32)).contains("float (f32)"));
        assert!(reason(to_key(&Some(1))).contains("Option"));
        assert!(reason(to_key(&None::<u8>)).contains("Option"));
        assert!(reason(to_key(&std::collections::BTreeMap::from([(1, 2)]))).contains("map"));
        for variant in [Region::Other(1), Region::Named { id: 1 }, Region::Both(1, 2)] {
            assert!(reason(to_key(&variant)).contains("Region::"));
        }
        assert_eq!(to_key(&(u128::from(u64::MAX) + 1)), Err(KeyError::IntOutOfRange { at: 0 }));
        assert_eq!(to_key(&(i128::from(i64::MIN) - 1)), Err(KeyError::IntOutOfRange { at: 0 }));
    }

    #[test]
    fn limits_hold_while_serializing() {
        let long = "x".repeat(MAX_KEY_BYTES);
        assert!(matches!(to_key(long.as_str()), Err(KeyError::TooLong { .. })));
        let many = vec![0u64; MAX_KEY_BYTES];
        assert!(matches!(to_key(&many), Err(KeyError::TooLong { .. })));
        // Sixteen tuples deep is the most a key may nest.
        let mut ok = serde_json::json!(1);
        for _ in 0..MAX_KEY_DEPTH {
            ok = serde_json::json!([ok]);
        }
        to_key(&ok).unwrap();
        assert_eq!(to_key(&serde_json::json!([ok])), Err(KeyError::TooDeep));
    }
}
