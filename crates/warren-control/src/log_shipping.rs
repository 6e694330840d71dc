//! Logs and usage kept centrally (issue 44). A task per node pulls the
//! node's shipping journal (`ship` in the node contract: a long poll, so
//! the pull itself is the back-pressure: the next batch is asked for only
//! once the last is kept) and keeps each batch together with the node's
//! new cursor in one transaction: a crash of either side, or a lost
//! connection, neither loses nor repeats a line. Reads then serve the kept
//! copy first and the node's newer lines after it, so a sandbox's log and
//! usage outlive it and its node. Retention deletes oldest first by age
//! and by total size.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use futures_util::StreamExt;
use warren_core::ApiError;
use warren_node_api::{NodeApi, ShipBatch, ShippedKind};

use crate::store::{LogCursor, LogEntry, LogKind, Store, StoreError};
use crate::streams::ByteStream;

/// Most entries asked for at once (one transaction each).
const BATCH: u32 = 2000;
/// How long a node holds a pull that finds nothing new.
const LONG_POLL: Duration = Duration::from_secs(5);
/// How long a node that does not ship (shipping off, an older node, the
/// fake) is left alone before it is asked again.
const NOT_SHIPPING_RETRY: Duration = Duration::from_secs(60);
/// Rows read per page when serving a kept log.
const PAGE: i64 = 1000;

/// How long and how much the kept copy holds.
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    /// Entries written longer ago are deleted.
    pub retention: Duration,
    /// Past this many bytes in all, the oldest are deleted.
    pub max_total: Option<u64>,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            retention: Duration::from_secs(7 * 86400),
            max_total: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ShipError {
    #[error("asking the node for its journal: {0}")]
    Node(#[source] warren_node_api::NodeError),
    #[error("keeping shipped logs: {0}")]
    Store(#[from] StoreError),
    /// Another writer moved the cursor (a replica that led before).
    #[error("the node's log cursor moved under this writer")]
    Stale,
}

/// One pull: what `node` wrote after `cursor`, kept with the new cursor.
/// Answers the cursor now kept.
pub(crate) async fn pull(
    store: &dyn Store,
    api: &dyn NodeApi,
    node: &str,
    cursor: Option<&LogCursor>,
    wait: Duration,
) -> Result<Option<LogCursor>, ShipError> {
    let journal = cursor.map(|c| c.journal.as_str());
    let after = cursor.map_or(0, |c| c.seq.max(0) as u64);
    let batch = api
        .ship(journal, after, BATCH, wait)
        .await
        .map_err(ShipError::Node)?;
    let to = LogCursor {
        journal: batch.journal.clone(),
        seq: batch.last as i64,
    };
    if cursor == Some(&to) && batch.entries.is_empty() {
        return Ok(Some(to));
    }
    if batch.dropped > 0 {
        tracing::warn!(
            node,
            dropped = batch.dropped,
            "the node's shipping journal dropped log lines before they were kept (its bound)"
        );
    }
    let entries = entries_of(node, batch);
    if !store.keep_shipped(node, cursor, &to, &entries).await? {
        return Err(ShipError::Stale);
    }
    // A log the node rotated past its cap loses the same lines here (a
    // crash before this keeps them a while longer: retention takes them).
    for (sandbox, before) in entries.iter().filter_map(rotated) {
        store.drop_rotated_lines(sandbox, node, before).await?;
    }
    Ok(Some(to))
}

/// The sandbox and the first seq it kept, of a `log_rotated` note.
fn rotated(e: &LogEntry) -> Option<(&str, i64)> {
    if e.kind != LogKind::Log || !e.body.contains("\"log_rotated\"") {
        return None;
    }
    let note: serde_json::Value = serde_json::from_str(&e.body).ok()?;
    let before = note.get("dropped_before_seq")?.as_i64()?;
    (note.get("reason")? == "log_rotated").then_some((e.sandbox_id.as_str(), before))
}

fn entries_of(node: &str, batch: ShipBatch) -> Vec<LogEntry> {
    batch
        .entries
        .into_iter()
        .map(|e| LogEntry {
            id: 0,
            sandbox_id: e.sandbox_id,
            node: node.to_string(),
            seq: e.seq as i64,
            kind: match e.kind {
                ShippedKind::Log => LogKind::Log,
                ShippedKind::Usage => LogKind::Usage,
            },
            time_ms: e.time_ms,
            body: e.body,
        })
        .collect()
}

/// How long a long poll of `ship` lasts (for the node-following task).
pub(crate) const PULL_WAIT: Duration = LONG_POLL;

/// Whether a failed pull says the node ships nothing (shipping off, an
/// older node, the fake): asked again only after [`NOT_SHIPPING_RETRY`].
pub(crate) fn retry_after(e: &ShipError) -> Option<Duration> {
    match e {
        ShipError::Node(e) if e.kind == warren_node_api::ErrorKind::Invalid => {
            Some(NOT_SHIPPING_RETRY)
        }
        _ => None,
    }
}

/// The cutoff of `limits` now: entries written before it are too old.
pub(crate) fn expiry(limits: LogLimits) -> (i64, Option<i64>) {
    let before = now_ms() - limits.retention.as_millis() as i64;
    let max = limits.max_total.map(|m| m.min(i64::MAX as u64) as i64);
    (before, max)
}

/// Whether the store keeps any log line of the sandbox.
pub(crate) async fn has_kept(store: &dyn Store, id: &str) -> Result<bool, ApiError> {
    Ok(!store
        .log_entries(id, LogKind::Log, 0, 0, 1)
        .await?
        .is_empty())
}

/// The usage samples kept of the sandbox, oldest first, one JSON line
/// each: `{"kind":"usage","sandbox_id":…,"time_ms":…,"usage":{…}}`.
pub(crate) async fn usage_lines(store: &dyn Store, id: &str) -> Result<ByteStream, ApiError> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .log_entries(id, LogKind::Usage, after, 0, PAGE)
            .await?;
        let Some(last) = page.last() else { break };
        after = last.id;
        for e in page {
            let usage: serde_json::Value =
                serde_json::from_str(&e.body).unwrap_or(serde_json::Value::Null);
            let line = serde_json::json!({
                "kind": "usage", "sandbox_id": e.sandbox_id, "time_ms": e.time_ms, "usage": usage,
            });
            let mut text = line.to_string().into_bytes();
            text.push(b'\n');
            out.push(Ok(Bytes::from(text)));
        }
    }
    Ok(futures_util::stream::iter(out).boxed())
}

/// Opens the node's part of a log once the kept part is read: given the
/// `seq` of the last line kept, it answers the lines after it.
pub(crate) type Newer =
    Box<dyn FnOnce(Option<u64>) -> futures_util::future::BoxFuture<'static, ByteStream> + Send>;

enum Part {
    Kept {
        after: i64,
        last: Option<u64>,
        page: std::collections::VecDeque<LogEntry>,
    },
    Newer(ByteStream),
    Done,
}

/// The kept lines of `id` (paged from the store), then `newer`'s.
pub(crate) fn kept_then(
    store: Arc<dyn Store>,
    id: String,
    since_ms: i64,
    newer: Newer,
) -> ByteStream {
    let start = Part::Kept {
        after: 0,
        last: None,
        page: Default::default(),
    };
    futures_util::stream::unfold((start, Some(newer)), move |(mut part, mut newer)| {
        let (store, id) = (store.clone(), id.clone());
        async move {
            loop {
                match &mut part {
                    Part::Kept { after, last, page } => {
                        if let Some(e) = page.pop_front() {
                            *after = e.id;
                            *last = Some(e.seq.max(0) as u64);
                            let mut text = e.body.into_bytes();
                            text.push(b'\n');
                            return Some((Ok(Bytes::from(text)), (part, newer)));
                        }
                        match store
                            .log_entries(&id, LogKind::Log, *after, since_ms, PAGE)
                            .await
                        {
                            Ok(rows) if !rows.is_empty() => page.extend(rows),
                            Ok(_) => {
                                let last = *last;
                                part = match newer.take() {
                                    Some(open) => Part::Newer(open(last).await),
                                    None => Part::Done,
                                };
                            }
                            Err(e) => {
                                return Some((Err(e.into()), (Part::Done, None)));
                            }
                        }
                    }
                    Part::Newer(lines) => match lines.next().await {
                        Some(item) => return Some((item, (part, newer))),
                        None => part = Part::Done,
                    },
                    Part::Done => return None,
                }
            }
        }
    })
    .boxed()
}

/// The node's lines numbered after `last` (all of them when nothing is
/// kept) and written at `since_ms` or later (0: any time). A line without
/// a number (written before the node shipped, or its own rotation note)
/// is in the kept copy's time already; one without a readable time is
/// kept, as the newest lines are.
pub(crate) fn newer_lines(lines: ByteStream, last: Option<u64>, since_ms: i64) -> ByteStream {
    #[derive(serde::Deserialize)]
    struct Line {
        seq: Option<u64>,
        time: Option<String>,
    }
    let written_ms = |time: &str| {
        let t = time::OffsetDateTime::parse(time, &time::format_description::well_known::Rfc3339);
        t.ok()
            .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
    };
    whole_lines(lines)
        .filter(move |line| {
            let keep = match line {
                Ok(text) if last.is_some() || since_ms > 0 => {
                    match serde_json::from_slice::<Line>(text) {
                        Ok(l) => {
                            let after = last.is_none_or(|last| l.seq.is_some_and(|s| s > last));
                            let written = l.time.as_deref().and_then(written_ms);
                            after && written.is_none_or(|ms| ms >= since_ms)
                        }
                        Err(_) => last.is_none(),
                    }
                }
                _ => true,
            };
            std::future::ready(keep)
        })
        .boxed()
}

/// The bytes of `body` cut into whole lines (a transport may split or
/// join them).
fn whole_lines(body: ByteStream) -> ByteStream {
    futures_util::stream::unfold(
        (body, Vec::<u8>::new(), false),
        |(mut body, mut buf, mut ended)| async move {
            loop {
                if let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let rest = buf.split_off(i + 1);
                    let line = std::mem::replace(&mut buf, rest);
                    return Some((Ok(Bytes::from(line)), (body, buf, ended)));
                }
                if ended {
                    if buf.is_empty() {
                        return None;
                    }
                    let line = std::mem::take(&mut buf);
                    return Some((Ok(Bytes::from(line)), (body, buf, ended)));
                }
                match body.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => return Some((Err(e), (body, buf, true))),
                    None => ended = true,
                }
            }
        },
    )
    .boxed()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_node_api::fake::FakeNode;

    async fn lines(store: &dyn Store, id: &str) -> Vec<String> {
        let kept = store.log_entries(id, LogKind::Log, 0, 0, 10_000).await;
        kept.map(|k| k.into_iter().map(|e| e.body).collect())
            .unwrap_or_default()
    }

    /// Pulls resume from the kept cursor: a failed pull, a writer whose
    /// cursor went stale and a restart (a cursor read anew) neither lose
    /// nor repeat a line.
    #[tokio::test]
    async fn pulls_resume_from_the_kept_cursor_without_gap_or_duplicate() -> Result<(), ShipError> {
        let dir =
            tempfile::tempdir().map_err(|e| ShipError::Store(StoreError::Commit(e.to_string())))?;
        let store = crate::store::SqliteStore::open(&dir.path().join("w.db")).await?;
        let node = FakeNode::new("n1", Default::default());
        for i in 1..=3 {
            node.log_line("sbx-1", &format!("{{\"n\":{i}}}"));
        }
        let first = pull(&store, node.as_ref(), "n1", None, Duration::ZERO).await?;
        assert_eq!(first.as_ref().map(|c| c.seq), Some(3));
        // The node fails once: nothing moves.
        node.fail_next("ship", warren_node_api::NodeError::unavailable("cut"));
        assert!(
            pull(&store, node.as_ref(), "n1", first.as_ref(), Duration::ZERO)
                .await
                .is_err()
        );
        node.log_line("sbx-1", r#"{"n":4}"#);
        // A writer still at no cursor (a replica that led before) keeps nothing.
        assert!(matches!(
            pull(&store, node.as_ref(), "n1", None, Duration::ZERO).await,
            Err(ShipError::Stale)
        ));
        // A restart reads the cursor kept and goes on from it.
        let kept = store.log_cursor("n1").await?;
        assert_eq!(kept, first);
        let next = pull(&store, node.as_ref(), "n1", kept.as_ref(), Duration::ZERO).await?;
        assert_eq!(next.map(|c| c.seq), Some(4));
        let want: Vec<String> = (1..=4).map(|i| format!("{{\"n\":{i}}}")).collect();
        assert_eq!(lines(&store, "sbx-1").await, want);
        Ok(())
    }

    #[tokio::test]
    async fn lines_after_the_kept_ones_are_cut_whole_and_filtered_by_seq_and_time() {
        let newer = |chunks: Vec<&'static [u8]>, last, since_ms| async move {
            let chunks = chunks
                .into_iter()
                .map(|c| Ok::<_, ApiError>(Bytes::from_static(c)));
            let body = futures_util::stream::iter(chunks).boxed();
            let got: Vec<Bytes> = newer_lines(body, last, since_ms)
                .filter_map(|r| std::future::ready(r.ok()))
                .collect()
                .await;
            got
        };
        let split = vec![
            &b"{\"seq\":1,\"t\":\"a\"}\n{\"seq\""[..],
            b":2}\n{\"t\":\"no seq\"}\n{\"seq\":3}",
        ];
        assert_eq!(
            newer(split, Some(1), 0).await,
            [&b"{\"seq\":2}\n"[..], &b"{\"seq\":3}"[..]]
        );
        // 2026-12-06T22:00:00Z is 1796594400000 ms.
        let timed = vec![
            &b"{\"seq\":5,\"time\":\"2026-12-06T21:59:59.999Z\"}\n"[..],
            b"{\"seq\":6,\"time\":\"2026-12-06T22:00:00Z\"}\n{\"seq\":7}\n",
        ];
        assert_eq!(
            newer(timed.clone(), None, 1_796_594_400_000).await,
            [
                &b"{\"seq\":6,\"time\":\"2026-12-06T22:00:00Z\"}\n"[..],
                b"{\"seq\":7}\n"
            ]
        );
        assert_eq!(
            newer(timed, Some(6), 1_796_594_400_000).await,
            [&b"{\"seq\":7}\n"[..]]
        );
    }
}
