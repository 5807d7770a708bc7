//! A connection as a query sees it ([`Db`]): the pooled client, the names
//! its errors carry, and the few calls every other file makes with it.
//!
//! Rules kept here:
//! - **Every failure names the store**: a driver error becomes
//!   [`StateError::Storage`] and a value that cannot be read
//!   [`StateError::Corrupt`], both with the store's location.
//! - **A transaction needs the connection alone**: [`Db::take`] hands it
//!   out owned, and refuses while a snapshot's workers share it.
//! - **Numbers cross as PostgreSQL's types**: a partition is an `integer`
//!   of the same bits ([`i32_of`]), an offset a `bigint`, refused past it
//!   ([`i64_of`]).

use std::sync::Arc;

use deadpool_postgres::Object;

use super::super::StateError;

/// What a query on the store's runtime works with: a pooled connection and
/// the names errors carry.
pub(super) struct Db {
    pub(super) projection: Arc<str>,
    pub(super) location: Arc<str>,
    /// Shared with the batch workers when it is a snapshot's.
    pub(super) client: Option<Arc<Object>>,
}

impl Db {
    pub(super) fn client(&self) -> &tokio_postgres::Client {
        // Every `Db` a query sees was built with its connection.
        self.client.as_deref().map(|object| &***object).expect("a connection")
    }

    /// The connection with its cache of prepared statements.
    fn wrapper(&self) -> &deadpool_postgres::ClientWrapper {
        // Every `Db` a query sees was built with its connection.
        self.client.as_deref().map(|object| &**object).expect("a connection")
    }

    /// `sql` prepared on this connection, once per connection.
    pub(super) async fn prepared(&self, sql: &str) -> Result<tokio_postgres::Statement, StateError> {
        self.wrapper().prepare_cached(sql).await.map_err(|e| self.error(e))
    }

    pub(super) fn error(&self, e: impl std::error::Error + Send + Sync + 'static) -> StateError {
        StateError::Storage { store: self.location.to_string(), source: Box::new(e) }
    }

    pub(super) fn corrupt(&self, what: String) -> StateError {
        StateError::Corrupt { store: self.location.to_string(), what }
    }

    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StateError> {
        self.client().query(sql, params).await.map_err(|e| self.error(e))
    }

    /// The count a `SELECT count(*) …` answers.
    pub(super) async fn count(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<usize, StateError> {
        let rows = self.query(sql, params).await?;
        let count: i64 = rows.first().map_or(0, |row| row.get(0));
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// The connection, owned: `run` hands each call its own.
    pub(super) fn take(&mut self) -> Result<Object, StateError> {
        self.client.take().and_then(Arc::into_inner).ok_or_else(|| StateError::Storage {
            store: self.location.to_string(),
            source: "a shared connection cannot open a transaction".into(),
        })
    }

    /// A second handle on the same connection, for a snapshot's queries.
    pub(super) fn share(&self) -> Self {
        Self { projection: self.projection.clone(), location: self.location.clone(), client: self.client.clone() }
    }
}

/// A partition as PostgreSQL's `integer` (partitions are far below 2^31;
/// a larger one would wrap, so it is mapped to the same bits).
pub(super) fn i32_of(partition: u32) -> i32 {
    partition as i32
}

/// An offset or sequence number as PostgreSQL's `bigint`, refused past it.
pub(super) fn i64_of(n: u64, location: &str) -> Result<i64, StateError> {
    i64::try_from(n).map_err(|_| StateError::Storage {
        store: location.to_owned(),
        source: format!("{n} is past PostgreSQL's bigint").into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unconnected() -> Db {
        Db { projection: "bank".into(), location: "postgres `h:5432/db` projection `bank`".into(), client: None }
    }

    #[test]
    fn a_driver_error_names_the_store_and_keeps_its_cause() {
        let db = unconnected();
        let error = db.error(std::io::Error::other("connection reset"));
        let StateError::Storage { store, source } = &error else { panic!("not a storage error: {error}") };
        assert_eq!(store, "postgres `h:5432/db` projection `bank`");
        assert_eq!(source.to_string(), "connection reset");
        let error = db.corrupt("counter `c` holds x".to_owned());
        assert!(
            matches!(&error, StateError::Corrupt { store, what } if store == &*db.location && what == "counter `c` holds x"),
            "{error}"
        );
    }

    #[test]
    fn a_connection_shared_or_missing_is_not_taken_for_a_transaction() {
        let mut db = unconnected();
        let Err(StateError::Storage { store, source }) = db.take() else {
            panic!("a connection taken, or another error")
        };
        assert_eq!(store, &*db.location);
        assert_eq!(source.to_string(), "a shared connection cannot open a transaction");
        let shared = db.share();
        assert_eq!((&*shared.projection, &*shared.location), (&*db.projection, &*db.location));
        assert!(shared.client.is_none());
    }

    #[test]
    fn partitions_keep_their_bits_and_offsets_past_bigint_are_refused() {
        assert_eq!(i32_of(7), 7);
        assert_eq!(i32_of(u32::MAX) as u32, u32::MAX, "the same bits");
        assert_eq!(i64_of(i64::MAX as u64, "here").unwrap(), i64::MAX);
        let error = i64_of(i64::MAX as u64 + 1, "here").unwrap_err();
        let StateError::Storage { store, source } = &error else { panic!("not a storage error: {error}") };
        assert_eq!(store, "here");
        assert_eq!(source.to_string(), "9223372036854775808 is past PostgreSQL's bigint");
    }
}
