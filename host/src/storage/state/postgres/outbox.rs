//! The outbox in its tables: the statements a commit adds and settles
//! entries with ([`ADD_OUTBOX`], [`SETTLE_OUTBOX`]) and the reads of what
//! is pending ([`outbox`], [`outbox_of`]).
//!
//! Rules kept here:
//! - **Sequence numbers come from `waku_outbox_next`**, taken for a
//!   commit's entries in the same statement that adds them, so they keep
//!   increasing across commits and hosts, in the order of the commit.
//! - **Each row names the partition whose commit added it**
//!   ([`OutboxEntry::source`]): that partition's host reads and settles
//!   its own rows only.
//! - **An entry that cannot be read is corrupt state**, naming its
//!   sequence number, never skipped.

use super::super::{OutboxEntry, StateError, decode_outbox};
use super::db::{Db, i32_of};

/// Removes `$2`'s pending entries up to and including `$3`.
pub(super) const SETTLE_OUTBOX: &str = "DELETE FROM waku_outbox WHERE projection = $1 AND partition = $2 AND seq <= $3";

/// Takes `$2` sequence numbers and adds the entries under them, in order.
pub(super) const ADD_OUTBOX: &str = "WITH n AS ( \
         INSERT INTO waku_outbox_next (projection, next) VALUES ($1, $2) \
         ON CONFLICT (projection) DO UPDATE SET next = waku_outbox_next.next + excluded.next RETURNING next \
     ) \
     INSERT INTO waku_outbox (projection, seq, entry, partition) \
     SELECT $1, n.next - $2 + u.ord - 1, u.entry, u.partition \
     FROM n, unnest($3::bytea[], $4::integer[]) WITH ORDINALITY AS u(entry, partition, ord)";

/// Every pending entry, by sequence number.
pub(super) async fn outbox(db: &Db) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
    let rows =
        db.query("SELECT seq, entry FROM waku_outbox WHERE projection = $1 ORDER BY seq", &[&&*db.projection]).await?;
    rows.iter().map(|row| entry_of(db, row.get(0), row.get(1))).collect()
}

/// The pending entries `partition`'s commits added, by sequence number.
pub(super) async fn outbox_of(db: &Db, partition: u32) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
    let rows = db
        .query(
            "SELECT seq, entry FROM waku_outbox WHERE projection = $1 AND partition = $2 ORDER BY seq",
            &[&&*db.projection, &i32_of(partition)],
        )
        .await?;
    rows.iter().map(|row| entry_of(db, row.get(0), row.get(1))).collect()
}

/// The entry of row `seq` from its stored bytes.
fn entry_of(db: &Db, seq: i64, bytes: &[u8]) -> Result<(u64, OutboxEntry), StateError> {
    let seq = seq.unsigned_abs();
    Ok((seq, decode_outbox(seq, bytes).map_err(|what| db.corrupt(what))?))
}

#[cfg(test)]
mod tests {
    use super::super::super::encode_outbox;
    use super::*;

    #[test]
    fn a_row_reads_back_as_its_entry_and_unreadable_bytes_are_corrupt_state_naming_it() {
        let db = Db { projection: "bank".into(), location: "here".into(), client: None };
        let entry = OutboxEntry {
            topic: "retry_t".into(),
            partition_key: 9,
            partition: Some(5),
            record: crate::storage::log::Record::default(),
            origin: None,
        };
        let bytes = encode_outbox(&entry, "here").unwrap();
        assert_eq!(entry_of(&db, 7, &bytes).unwrap(), (7, entry));
        let error = entry_of(&db, 8, &[0xff; 3]).unwrap_err();
        assert!(
            matches!(&error, StateError::Corrupt { store, what } if store == "here" && what.starts_with("outbox entry 8:")),
            "{error}"
        );
    }
}
