//! A batch's keys, numbered: the planner groups records by a number per
//! key, and the consumer gives each distinct key of a batch (its canonical
//! bytes) its own, in order of first appearance.
//!
//! Rules it keeps:
//! - **Bytes are the identity.** Two records share a number exactly when
//!   their key bytes are equal, whatever their hashes, so colliding keys
//!   never share a run, a fold, a state scope or a retry diversion.
//! - **Checked once per key.** The bytes of a key new to the batch are
//!   checked and made a [`Key`] ([`Key::from_canonical`]); a record of a
//!   key already numbered costs one lookup, no allocation.
//! - **Seeded hashing.** Key bytes are chosen by publishers, so the table
//!   hashes them with a hasher seeded per table (foldhash's
//!   `RandomState`): nobody can choose keys that collide in it.

use hashbrown::HashTable;

use crate::key::{Key, KeyError};

/// Key bytes → the key's number in this batch, and the [`Key`] of each
/// number.
#[derive(Default)]
pub(super) struct KeyTable {
    /// Per entry: the hash of the key's bytes and its number.
    numbers: HashTable<(u64, u32)>,
    hasher: foldhash::fast::RandomState,
    /// The keys, by number.
    keys: Vec<Key>,
}

impl KeyTable {
    /// Forgets every key, keeping the allocations.
    pub(super) fn clear(&mut self) {
        self.numbers.clear();
        self.keys.clear();
    }

    /// The number of the key with canonical `bytes`, numbering it if it is
    /// new; bytes that are not a canonical key are refused with the reason
    /// (and numbered not).
    pub(super) fn number(&mut self, bytes: &[u8]) -> Result<u32, KeyError> {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(bytes);
        let keys = &self.keys;
        if let Some(&(_, number)) = self.numbers.find(hash, |&(_, number)| keys[number as usize].as_bytes() == bytes) {
            return Ok(number);
        }
        let key = Key::from_canonical(bytes)?;
        // A batch holds at most u32::MAX records (the planner's bound).
        let number = u32::try_from(self.keys.len()).expect("at most u32::MAX keys in a batch");
        self.keys.push(key);
        self.numbers.insert_unique(hash, (hash, number), |&(hash, _)| hash);
        Ok(number)
    }

    /// Every key of the batch, by number.
    pub(super) fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// The key with `number`.
    ///
    /// # Panics
    /// If no key has that number.
    pub(super) fn key(&self, number: u32) -> &Key {
        &self.keys[number as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_share_a_number_and_keys_are_numbered_in_order_of_first_appearance() {
        let mut table = KeyTable::default();
        let keys = [Key::int(7), Key::parse_text(r#""ann""#).unwrap(), Key::int(7), Key::int(8), Key::int(8)];
        let numbers: Vec<u32> = keys.iter().map(|key| table.number(key.as_bytes()).unwrap()).collect();
        assert_eq!(numbers, [0, 1, 0, 2, 2]);
        assert_eq!(table.key(1), &keys[1]);
        assert_eq!(table.key(2), &keys[3]);
        table.clear();
        assert_eq!(table.number(keys[3].as_bytes()), Ok(0), "a cleared table numbers from 0 again");
    }

    #[test]
    fn bytes_that_are_not_a_canonical_key_are_refused_and_not_numbered() {
        let mut table = KeyTable::default();
        assert_eq!(table.number(&[]), Err(KeyError::Empty));
        assert_eq!(table.number(&[0x01, 0x54, 0x00]), Err(KeyError::TrailingBytes { extra: 1 }));
        assert_eq!(table.number(Key::int(1).as_bytes()), Ok(0));
    }

    #[test]
    fn many_keys_keep_their_numbers_as_the_table_grows() {
        let mut table = KeyTable::default();
        for round in 0..2 {
            for i in 0..5000u64 {
                assert_eq!(table.number(Key::int(i).as_bytes()), Ok(i as u32), "round {round}");
            }
        }
        assert_eq!(table.key(4321), &Key::int(4321u64));
    }
}
