//! The schema: its versions ([`MIGRATIONS`]), how a host creates or
//! migrates it when it connects ([`migrate`]), how a read-only command
//! finds the projections it holds ([`projections`]), and each
//! projection's read-model view ([`view_name`]).
//!
//! Rules kept here:
//! - **Versions are rows of `waku_schema`**, applied in order in one
//!   transaction under an advisory lock ([`MIGRATION_LOCK`]), so hosts
//!   starting together never race; a published migration is never
//!   edited, only followed by another.
//! - **A newer schema is refused** ([`StateError::SchemaTooNew`]); a
//!   read-only command refuses an older one too, which reading as it is
//!   could misread ([`OlderSchema`]).
//! - **Text is UTF-8**: a database that converts text to another encoding
//!   would refuse some names at every commit, so it is refused at connect
//!   ([`NotUtf8`]); SQL_ASCII converts nothing and is taken.
//! - **Each projection's view has a name of its own**, cut and hashed
//!   when PostgreSQL would cut it ([`view_name`]).

use super::super::{StateError, decode_outbox};
use super::db::{Db, i32_of};

/// The schema, one migration per version: `MIGRATIONS[n]` takes the
/// database from version `n` to `n + 1`. Append; never edit a published one.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE FUNCTION waku_json(value bytea) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(value, 'UTF8')::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;
CREATE TABLE waku_state (
    projection text COLLATE "C" NOT NULL,
    key bytea NOT NULL,
    name text COLLATE "C" NOT NULL,
    key_text text NOT NULL,
    value bytea NOT NULL,
    json jsonb GENERATED ALWAYS AS (waku_json(value)) STORED,
    PRIMARY KEY (projection, key, name)
);
CREATE TABLE waku_counters (
    projection text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    value numeric(40, 0) NOT NULL,
    PRIMARY KEY (projection, name)
);
CREATE TABLE waku_stats (
    projection text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    value numeric(20, 0) NOT NULL,
    PRIMARY KEY (projection, name)
);
CREATE TABLE waku_positions (
    projection text COLLATE "C" NOT NULL,
    topic text COLLATE "C" NOT NULL,
    partition integer NOT NULL,
    next bigint NOT NULL,
    PRIMARY KEY (projection, topic, partition)
);
CREATE TABLE waku_done (
    projection text COLLATE "C" NOT NULL,
    topic text COLLATE "C" NOT NULL,
    partition integer NOT NULL,
    record bigint NOT NULL,
    PRIMARY KEY (projection, topic, partition, record)
);
CREATE TABLE waku_outbox (
    projection text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    entry bytea NOT NULL,
    PRIMARY KEY (projection, seq)
);
CREATE TABLE waku_outbox_next (
    projection text COLLATE "C" PRIMARY KEY,
    next bigint NOT NULL
);
CREATE TABLE waku_meta (
    projection text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (projection, name)
);
CREATE TABLE waku_epochs (
    projection text COLLATE "C" NOT NULL,
    partition integer NOT NULL,
    epoch bigint NOT NULL,
    PRIMARY KEY (projection, partition)
);
"#,
    r#"
ALTER TABLE waku_outbox ADD COLUMN partition integer;
CREATE INDEX waku_outbox_partition ON waku_outbox (projection, partition, seq);
"#,
    // The host checks JSON itself ([`json_text`]) and sends it beside the
    // bytes: no plpgsql call, and no subtransaction, per row written.
    r#"
ALTER TABLE waku_state ALTER COLUMN json DROP EXPRESSION;
DROP FUNCTION waku_json(bytea);
"#,
    // Per-key event-time timers, committed with the batch; found by time
    // per partition when the clock passes them.
    r#"
CREATE TABLE waku_timers (
    projection text COLLATE "C" NOT NULL,
    key bytea NOT NULL,
    name text COLLATE "C" NOT NULL,
    partition integer NOT NULL,
    at bigint NOT NULL,
    payload bytea NOT NULL,
    PRIMARY KEY (projection, key, name)
);
CREATE INDEX waku_timers_due ON waku_timers (projection, partition, at, key);
"#,
];

/// The advisory lock held while the schema is migrated ("waku" in ASCII).
const MIGRATION_LOCK: i64 = 0x7761_6b75;

/// The schema version this build migrates to.
fn known_version() -> i32 {
    MIGRATIONS.len() as i32
}

/// The projections the database holds, creating nothing: none when it
/// holds no waku schema; an error when its schema is one this build
/// would have to migrate (reading it as it is could misread it).
pub(super) async fn projections(mut db: Db) -> Result<Vec<String>, StateError> {
    let client = db.take()?;
    let row = client.query_one("SELECT to_regclass('waku_schema') IS NOT NULL", &[]).await.map_err(|e| db.error(e))?;
    if !row.get::<_, bool>(0) {
        return Ok(Vec::new());
    }
    let row =
        client.query_one("SELECT coalesce(max(version), 0) FROM waku_schema", &[]).await.map_err(|e| db.error(e))?;
    let (found, known): (i32, i32) = (row.get(0), known_version());
    if found > known {
        return Err(StateError::SchemaTooNew { store: db.location.to_string(), found, known });
    }
    if found < known {
        return Err(db.error(OlderSchema { found, known }));
    }
    let rows = client
        .query(
            "SELECT projection FROM waku_positions UNION SELECT projection FROM waku_epochs \
             UNION SELECT projection FROM waku_meta ORDER BY 1",
            &[],
        )
        .await
        .map_err(|e| db.error(e))?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// Creates or migrates the schema and the projection's view.
pub(super) async fn migrate(mut db: Db) -> Result<(), StateError> {
    let mut client = db.take()?;
    // Names are any UTF-8 a module chooses: a database that converts
    // text to another encoding would refuse some at commit, every
    // time, and wedge the partition. SQL_ASCII converts nothing.
    let row = client.query_one("SELECT current_setting('server_encoding')", &[]).await.map_err(|e| db.error(e))?;
    let encoding: String = row.get(0);
    if encoding != "UTF8" && encoding != "SQL_ASCII" {
        return Err(db.error(NotUtf8 { encoding }));
    }
    let txn = client.transaction().await.map_err(|e| db.error(e))?;
    txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(|e| db.error(e))?;
    txn.batch_execute("CREATE TABLE IF NOT EXISTS waku_schema (version integer PRIMARY KEY)")
        .await
        .map_err(|e| db.error(e))?;
    let row = txn.query_one("SELECT coalesce(max(version), 0) FROM waku_schema", &[]).await.map_err(|e| db.error(e))?;
    let found: i32 = row.get(0);
    let known = known_version();
    if found > known {
        return Err(StateError::SchemaTooNew { store: db.location.to_string(), found, known });
    }
    for (version, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        txn.batch_execute(migration).await.map_err(|e| db.error(e))?;
        txn.execute("INSERT INTO waku_schema (version) VALUES ($1)", &[&(version as i32 + 1)])
            .await
            .map_err(|e| db.error(e))?;
        if version == 1 {
            give_outbox_rows_their_partition(&db, &txn).await?;
        }
    }
    txn.batch_execute(&view_sql(&db.projection)).await.map_err(|e| db.error(e))?;
    txn.commit().await.map_err(|e| db.error(e))
}

/// Version 2 gives each outbox row its partition, which only the entry's
/// bytes tell: read from each row of version 1, then required.
async fn give_outbox_rows_their_partition(db: &Db, txn: &deadpool_postgres::Transaction<'_>) -> Result<(), StateError> {
    let rows = txn.query("SELECT projection, seq, entry FROM waku_outbox", &[]).await.map_err(|e| db.error(e))?;
    for row in rows {
        let (projection, seq, entry): (&str, i64, &[u8]) = (row.get(0), row.get(1), row.get(2));
        let source = decode_outbox(seq.unsigned_abs(), entry).map_or(0, |entry| entry.source());
        txn.execute(
            "UPDATE waku_outbox SET partition = $3 WHERE projection = $1 AND seq = $2",
            &[&projection, &seq, &i32_of(source)],
        )
        .await
        .map_err(|e| db.error(e))?;
    }
    txn.batch_execute("ALTER TABLE waku_outbox ALTER COLUMN partition SET NOT NULL").await.map_err(|e| db.error(e))
}

/// The statement that creates (or replaces) `projection`'s view. The
/// projection's name is checked (letters, digits, `.`, `_`, `-`), so it
/// quotes safely as an identifier and as a literal.
fn view_sql(projection: &str) -> String {
    let view = view_name(projection);
    format!(
        "CREATE OR REPLACE VIEW \"{view}\" AS \
         SELECT key_text AS key, name, json, value FROM waku_state WHERE projection = '{projection}'"
    )
}

/// The longest identifier PostgreSQL keeps whole (it cuts longer ones).
pub(super) const MAX_IDENTIFIER: usize = 63;

/// The name of `projection`'s read-model view: `waku_state_<projection>`,
/// or, when that is longer than PostgreSQL keeps (which would cut it, and
/// two long projection names would share one view), its first bytes, `_`
/// and 16 hex digits of the SHA-256 of the projection's name.
pub(super) fn view_name(projection: &str) -> String {
    use sha2::Digest;
    let full = format!("waku_state_{projection}");
    if full.len() <= MAX_IDENTIFIER {
        return full;
    }
    let digest = sha2::Sha256::digest(projection.as_bytes());
    let hash: String = digest[..8].iter().map(|byte| format!("{byte:02x}")).collect();
    // Projection names are ASCII (checked at connect), so any cut is a
    // character boundary.
    format!("{}_{hash}", &full[..MAX_IDENTIFIER - 1 - hash.len()])
}

/// A database whose text is not UTF-8.
#[derive(Debug, thiserror::Error)]
#[error(
    "the database stores text as {encoding}, and the state needs UTF8: use a database created with ENCODING 'UTF8'"
)]
struct NotUtf8 {
    encoding: String,
}

/// A read-only command found a schema `waku run` has not migrated yet.
#[derive(Debug, thiserror::Error)]
#[error("the database holds schema version {found} and this build reads {known}: `waku run` migrates it")]
struct OlderSchema {
    found: i32,
    known: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_name_is_kept_whole_up_to_the_identifier_limit_then_cut_and_hashed() {
        assert_eq!(view_name("bank"), "waku_state_bank");
        let longest = "p".repeat(MAX_IDENTIFIER - "waku_state_".len());
        assert_eq!(view_name(&longest), format!("waku_state_{longest}"), "63 bytes are kept whole");
        let (first, second) = (format!("{longest}1"), format!("{longest}2"));
        let (cut_first, cut_second) = (view_name(&first), view_name(&second));
        assert_ne!(cut_first, cut_second, "two long names share their first bytes, not their view");
        for cut in [&cut_first, &cut_second] {
            assert_eq!(cut.len(), MAX_IDENTIFIER, "{cut}");
            let (head, hash) = cut.rsplit_once('_').unwrap();
            assert!(head.starts_with("waku_state_ppp") && hash.len() == 16, "{cut}");
            assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()), "{cut}");
        }
        assert_eq!(view_name(&first), cut_first, "the same name, the same view");
    }

    #[test]
    fn the_view_quotes_its_name_as_an_identifier_and_the_projection_as_a_literal() {
        assert_eq!(
            view_sql("bank-2.eu"),
            "CREATE OR REPLACE VIEW \"waku_state_bank-2.eu\" AS SELECT key_text AS key, name, json, value \
             FROM waku_state WHERE projection = 'bank-2.eu'"
        );
    }

    #[test]
    fn the_first_version_creates_every_table_and_every_version_is_applied() {
        for table in [
            "waku_state",
            "waku_counters",
            "waku_stats",
            "waku_positions",
            "waku_done",
            "waku_outbox",
            "waku_outbox_next",
            "waku_meta",
            "waku_epochs",
        ] {
            assert!(MIGRATIONS[0].contains(&format!("CREATE TABLE {table} (")), "{table}");
        }
        assert_eq!(known_version(), 4);
        assert!(MIGRATIONS[3].contains("CREATE TABLE waku_timers ("), "version 4 adds the timers");
        assert!(MIGRATIONS[1].contains("ADD COLUMN partition"), "version 2 is the one the outbox rows are given for");
        assert_eq!(MIGRATION_LOCK.to_be_bytes()[4..], *b"waku");
    }

    #[test]
    fn a_refused_schema_or_encoding_says_what_to_do() {
        let older = OlderSchema { found: 2, known: 3 }.to_string();
        assert!(older.contains("schema version 2") && older.contains("reads 3") && older.contains("`waku run`"));
        let latin1 = NotUtf8 { encoding: "LATIN1".into() }.to_string();
        assert!(latin1.contains("stores text as LATIN1") && latin1.contains("ENCODING 'UTF8'"), "{latin1}");
    }
}
