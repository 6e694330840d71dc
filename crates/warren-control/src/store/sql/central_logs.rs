//! Logs and usage kept centrally: each node's shipped entries and how far
//! its journal has been taken (`sandbox_logs`, `log_cursors`, and the
//! running total of their bytes, `log_total`).

use super::{Arg, Dialect};
use crate::store::{LogCursor, LogEntry, LogKind, StoreError, StoreRow};

/// Rows one insert statement carries (fewer statements per batch: on
/// SQLite each is a trip to its connection's thread).
const CHUNK: usize = 16;

macro_rules! log_rows {
    (1) => {
        "(?, ?, ?, ?, ?, ?, ?)"
    };
    (2) => {
        concat!(log_rows!(1), ", ", log_rows!(1))
    };
    (4) => {
        concat!(log_rows!(2), ", ", log_rows!(2))
    };
    (8) => {
        concat!(log_rows!(4), ", ", log_rows!(4))
    };
    (16) => {
        concat!(log_rows!(8), ", ", log_rows!(8))
    };
}

macro_rules! log_insert {
    ($n:tt) => {
        sql!(concat!(
            "INSERT INTO sandbox_logs (sandbox_id, node, seq, kind, time_ms, body, bytes) VALUES ",
            log_rows!($n)
        ))
    };
}

pub(super) async fn cursor<D: Dialect>(
    store: &D,
    node: &str,
) -> Result<Option<LogCursor>, StoreError> {
    let sql = sql!("SELECT journal, seq FROM log_cursors WHERE node = ?");
    let Some(row) = store.fetch_optional(sql, args![node]).await? else {
        return Ok(None);
    };
    Ok(Some(LogCursor {
        journal: row.text("journal")?,
        seq: row.int("seq")?,
    }))
}

pub(super) async fn keep<D: Dialect>(
    store: &D,
    node: &str,
    from: Option<&LogCursor>,
    to: &LogCursor,
    entries: &[LogEntry],
) -> Result<bool, StoreError> {
    let mut tx = store.begin().await?;
    // The cursor first: a writer that lost the race keeps nothing (the
    // transaction is dropped, so rolled back).
    let moved = match from {
        None => {
            let sql = sql!(
                "INSERT INTO log_cursors (node, journal, seq) VALUES (?, ?, ?)
                 ON CONFLICT (node) DO NOTHING"
            );
            D::execute_in(&mut tx, sql, args![node, &to.journal, to.seq]).await?
        }
        Some(from) => {
            let sql = sql!(
                "UPDATE log_cursors SET journal = ?, seq = ?
                 WHERE node = ? AND journal = ? AND seq = ?"
            );
            let args = args![&to.journal, to.seq, node, &from.journal, from.seq];
            D::execute_in(&mut tx, sql, args).await?
        }
    };
    if moved != 1 {
        return Ok(false);
    }
    let mut bytes = 0i64;
    for chunk in entries.chunks(CHUNK) {
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(chunk.len() * 7);
        for e in chunk {
            bytes += e.body.len() as i64;
            args.extend([
                Arg::from(e.sandbox_id.as_str()),
                Arg::from(node),
                Arg::from(e.seq),
                Arg::from(e.kind.as_str()),
                Arg::from(e.time_ms),
                Arg::from(e.body.as_str()),
                Arg::from(e.body.len() as i64),
            ]);
        }
        if chunk.len() == CHUNK {
            D::execute_in(&mut tx, log_insert!(16), &args).await?;
        } else {
            for one in args.chunks(7) {
                D::execute_in(&mut tx, log_insert!(1), one).await?;
            }
        }
    }
    let sql = sql!("UPDATE log_total SET bytes = bytes + ? WHERE id = 1");
    D::execute_in(&mut tx, sql, args![bytes]).await?;
    // Only a sandbox that still lives: an ended one's usage is its final
    // reading, which a late sample must not replace.
    let sql = sql!(
        "UPDATE sandboxes SET usage = ?
         WHERE id = ? AND state IN ('creating', 'running', 'paused', 'stopping', 'kept')"
    );
    for e in entries.iter().filter(|e| e.kind == LogKind::Usage) {
        D::execute_in(&mut tx, sql, args![&e.body, &e.sandbox_id]).await?;
    }
    D::commit(tx).await?;
    Ok(true)
}

pub(super) async fn entries<D: Dialect>(
    store: &D,
    sandbox_id: &str,
    kind: LogKind,
    after: i64,
    since_ms: i64,
    limit: i64,
) -> Result<Vec<LogEntry>, StoreError> {
    let sql = sql!(
        "SELECT id, sandbox_id, node, seq, time_ms, body FROM sandbox_logs
         WHERE sandbox_id = ? AND kind = ? AND id > ? AND time_ms >= ?
         ORDER BY id LIMIT ?"
    );
    let args = args![sandbox_id, kind.as_str(), after, since_ms, limit];
    let rows = store.fetch_all(sql, args).await?;
    rows.iter()
        .map(|r| {
            Ok(LogEntry {
                id: r.int("id")?,
                sandbox_id: r.text("sandbox_id")?,
                node: r.text("node")?,
                seq: r.int("seq")?,
                kind,
                time_ms: r.int("time_ms")?,
                body: r.text("body")?,
            })
        })
        .collect()
}

pub(super) async fn total<D: Dialect>(store: &D) -> Result<i64, StoreError> {
    let sql = sql!("SELECT bytes FROM log_total WHERE id = 1");
    match store.fetch_optional(sql, &[]).await? {
        Some(row) => Ok(row.int("bytes")?),
        None => Ok(0),
    }
}

/// Rows looked at per round of [`expire`].
const EXPIRE_CHUNK: i64 = 5000;

pub(super) async fn expire<D: Dialect>(
    store: &D,
    before_ms: i64,
    max_bytes: Option<i64>,
) -> Result<u64, StoreError> {
    let mut deleted = 0u64;
    loop {
        let sql = sql!("SELECT id, time_ms, bytes FROM sandbox_logs ORDER BY id LIMIT ?");
        let rows = store.fetch_all(sql, args![EXPIRE_CHUNK]).await?;
        let mut over = match max_bytes {
            Some(max) => total(store).await? - max,
            None => 0,
        };
        // The oldest rows, as long as each is too old or the total too big.
        let mut cut = None;
        let mut n = 0u64;
        for r in &rows {
            if r.int("time_ms")? >= before_ms && over <= 0 {
                break;
            }
            over -= r.int("bytes")?;
            cut = Some(r.int("id")?);
            n += 1;
        }
        let Some(cut) = cut else {
            return Ok(deleted);
        };
        let mut tx = store.begin().await?;
        let sql = sql!(
            "UPDATE log_total SET bytes = bytes -
                (SELECT COALESCE(SUM(bytes), 0) FROM sandbox_logs WHERE id <= ?)
             WHERE id = 1"
        );
        D::execute_in(&mut tx, sql, args![cut]).await?;
        let sql = sql!("DELETE FROM sandbox_logs WHERE id <= ?");
        D::execute_in(&mut tx, sql, args![cut]).await?;
        D::commit(tx).await?;
        deleted += n;
        if n < rows.len() as u64 || rows.len() < EXPIRE_CHUNK as usize {
            return Ok(deleted);
        }
    }
}

/// Drops a sandbox's log lines from `node` below `before_seq`, and their
/// bytes from the total, in one transaction.
pub(super) async fn drop_rotated<D: Dialect>(
    store: &D,
    sandbox_id: &str,
    node: &str,
    before_seq: i64,
) -> Result<u64, StoreError> {
    let mut tx = store.begin().await?;
    let sql = sql!(
        "UPDATE log_total SET bytes = bytes -
            (SELECT COALESCE(SUM(bytes), 0) FROM sandbox_logs
             WHERE sandbox_id = ? AND node = ? AND kind = 'log' AND seq < ?)
         WHERE id = 1"
    );
    D::execute_in(&mut tx, sql, args![sandbox_id, node, before_seq]).await?;
    let sql = sql!(
        "DELETE FROM sandbox_logs WHERE sandbox_id = ? AND node = ? AND kind = 'log' AND seq < ?"
    );
    let n = D::execute_in(&mut tx, sql, args![sandbox_id, node, before_seq]).await?;
    D::commit(tx).await?;
    Ok(n)
}
