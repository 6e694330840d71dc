//! The node's shipping journal (`<home>/ship/`): every sandbox's log
//! lines and usage samples, numbered node-wide, for the control plane to
//! take away (`ship` in the node contract) and keep after the node is gone.
//!
//! Append-only segment files `<first seq>.ship`, one entry a line:
//! `SEQ \t KIND \t SANDBOX \t TIME_MS \t BODY`. Numbers go on across node
//! restarts (the last entry on disk says where); the journal's id (`id`,
//! made once) tells a caller whose cursor counts in another journal (the
//! home was replaced) to start again from 1. Bounded: segments the caller
//! has acknowledged (asked for what comes after them) are removed, and
//! past `max_bytes` the oldest go unasked, which a reader learns as
//! `dropped`.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use warren_core::sync::lock;
use warren_node_api::{ShipBatch, Shipped, ShippedKind};

/// Default bound of the journal on disk.
pub const DEFAULT_MAX: u64 = 256 << 20;

/// How long a long-polling reader that found fewer entries than it may take
/// waits for more: at 1,000 lines a second, a batch of ~250 per call instead
/// of one call per line or two (each a TLS round trip and a transaction).
pub const LINGER: Duration = Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("shipping journal {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub struct ShipJournal {
    dir: PathBuf,
    id: String,
    /// Bytes all segments may hold together.
    max_bytes: u64,
    /// Bytes one segment reaches before the next starts.
    segment_bytes: u64,
    inner: Mutex<Inner>,
    /// The newest entry's seq, for long-polling readers.
    written: watch::Sender<u64>,
}

struct Segment {
    first: u64,
    path: PathBuf,
    size: u64,
}

struct Inner {
    /// The seq the next entry gets.
    next: u64,
    /// Oldest first; the last is the one appended to.
    segments: VecDeque<Segment>,
    file: Option<File>,
    /// Where the last read stopped: (the seq after it, the segment's
    /// first seq, the byte offset), so a reader that keeps up does not
    /// scan its segment from the start each time.
    hint: Option<(u64, u64, u64)>,
}

impl ShipJournal {
    pub fn open(dir: &Path, max_bytes: u64) -> Result<ShipJournal, JournalError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let id = journal_id(dir)?;
        let mut segments: Vec<Segment> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let entry = entry.map_err(io(dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(first) = name.strip_suffix(".ship").and_then(|n| n.parse().ok()) else {
                continue;
            };
            let size = entry.metadata().map_err(io(&entry.path()))?.len();
            segments.push(Segment {
                first,
                path: entry.path(),
                size,
            });
        }
        segments.sort_by_key(|s| s.first);
        let mut inner = Inner {
            next: 1,
            segments: segments.into(),
            file: None,
            hint: None,
        };
        if let Some(last) = inner.segments.back_mut() {
            let file = OpenOptions::new()
                .append(true)
                .read(true)
                .open(&last.path)
                .map_err(io(&last.path))?;
            // A daemon killed mid-append leaves part of an entry.
            last.size = crate::torn::drop_torn_line(&file).map_err(io(&last.path))?;
            inner.next = match last_seq(&last.path).map_err(io(&last.path))? {
                Some(seq) => seq + 1,
                None => last.first,
            };
            inner.file = Some(file);
        }
        let journal = ShipJournal {
            dir: dir.to_path_buf(),
            id,
            max_bytes,
            segment_bytes: (max_bytes / 8).clamp(64 << 10, 64 << 20),
            written: watch::Sender::new(inner.next - 1),
            inner: Mutex::new(inner),
        };
        if lock(&journal.inner).file.is_none() {
            journal.start_segment(&mut lock(&journal.inner))?;
        }
        Ok(journal)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    fn start_segment(&self, inner: &mut Inner) -> Result<(), JournalError> {
        let path = self.dir.join(format!("{:020}.ship", inner.next));
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)
            .map_err(io(&path))?;
        inner.segments.push_back(Segment {
            first: inner.next,
            path,
            size: 0,
        });
        inner.file = Some(file);
        // Past the bound, the oldest go (never the one just started).
        let mut total: u64 = inner.segments.iter().map(|s| s.size).sum();
        while total > self.max_bytes && inner.segments.len() > 1 {
            if let Some(old) = inner.segments.pop_front() {
                total -= old.size;
                let _ = std::fs::remove_file(&old.path);
                tracing::warn!(
                    first = old.first,
                    "the shipping journal reached its bound before the control plane took its oldest entries; they are dropped"
                );
            }
        }
        Ok(())
    }

    /// Appends one entry; `body(seq)` makes its body (no newline) under
    /// the journal's lock, so bodies that carry their seq are written in
    /// seq order. Returns the seq and the body. Best effort, as the
    /// sandbox's own log is: a full disk does not fail the sandbox.
    pub fn append(
        &self,
        kind: ShippedKind,
        sandbox: &str,
        time_ms: i64,
        body: impl FnOnce(u64) -> Option<Vec<u8>>,
    ) -> Option<(u64, Vec<u8>)> {
        let mut inner = lock(&self.inner);
        let seq = inner.next;
        let body = body(seq)?;
        let kind = match kind {
            ShippedKind::Log => 'l',
            ShippedKind::Usage => 'u',
        };
        let mut entry = format!("{seq}\t{kind}\t{sandbox}\t{time_ms}\t").into_bytes();
        entry.extend_from_slice(&body);
        entry.push(b'\n');
        let full = inner
            .segments
            .back()
            .is_some_and(|s| s.size > 0 && s.size + entry.len() as u64 > self.segment_bytes);
        if full {
            if let Err(e) = self.start_segment(&mut inner) {
                tracing::warn!(error = %e, "starting a shipping journal segment");
            }
        }
        let size = inner.segments.back().map_or(0, |s| s.size);
        let file = inner.file.as_mut()?;
        if file.write_all(&entry).is_err() {
            // Cut back what the disk took of it, so the next entry is whole.
            let _ = file.set_len(size);
            return None;
        }
        if let Some(s) = inner.segments.back_mut() {
            s.size += entry.len() as u64;
        }
        inner.next = seq + 1;
        drop(inner);
        self.written.send_replace(seq);
        Some((seq, body))
    }

    /// Entries after `after` in journal `journal` (another journal, or
    /// none: from the start), at most `max` and about `max_bytes` of
    /// bodies; waits up to `wait` for one. Segments wholly at or before
    /// `after` of this journal are removed: the caller has them.
    pub async fn read(
        &self,
        journal: Option<&str>,
        after: u64,
        max: u32,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<ShipBatch, JournalError> {
        let after = if journal == Some(self.id.as_str()) {
            self.acknowledge(after);
            after
        } else {
            0
        };
        let mut written = self.written.subscribe();
        if *written.borrow_and_update() <= after && !wait.is_zero() {
            let _ = tokio::time::timeout(wait, written.wait_for(|last| *last > after)).await;
        }
        // A caller that keeps up would otherwise take a line or two per
        // call: it waits a moment for a batch worth its round trip.
        let ready = (*written.borrow()).saturating_sub(after);
        if !wait.is_zero() && ready > 0 && ready < u64::from(max) {
            tokio::time::sleep(LINGER.min(wait)).await;
        }
        // Inline: a batch is at most about `max_bytes` read from the page
        // cache, well under a millisecond.
        self.read_now(after, max, max_bytes)
    }

    fn acknowledge(&self, after: u64) {
        let mut inner = lock(&self.inner);
        // A segment is done when the next one starts at or before after+1.
        while inner.segments.len() > 1 && inner.segments[1].first <= after + 1 {
            if let Some(old) = inner.segments.pop_front() {
                let _ = std::fs::remove_file(&old.path);
            }
        }
    }

    fn read_now(&self, after: u64, max: u32, max_bytes: usize) -> Result<ShipBatch, JournalError> {
        // Where to start, and how far the files are whole (appends happen
        // under the lock, so sizes read under it end on an entry).
        let (plan, newest, hint) = {
            let inner = lock(&self.inner);
            let plan: Vec<(u64, PathBuf, u64)> = inner
                .segments
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    inner
                        .segments
                        .get(i + 1)
                        .is_none_or(|next| next.first > after + 1)
                })
                .map(|(_, s)| (s.first, s.path.clone(), s.size))
                .collect();
            (plan, inner.next - 1, inner.hint)
        };
        let mut batch = ShipBatch {
            journal: self.id.clone(),
            entries: Vec::new(),
            last: after,
            dropped: 0,
        };
        let Some(oldest) = plan.first().map(|p| p.0) else {
            return Ok(batch);
        };
        if oldest > after + 1 {
            batch.dropped = oldest - after - 1;
            batch.last = oldest - 1;
        }
        let mut bytes = 0usize;
        let mut stop = None;
        'segments: for (first, path, size) in plan {
            let mut file = match File::open(&path) {
                Ok(f) => f,
                // Removed by an acknowledgement or the bound meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(&path)(e)),
            };
            let start = match hint {
                Some((next, seg, offset)) if seg == first && next == batch.last + 1 => offset,
                _ => 0,
            };
            file.seek(std::io::SeekFrom::Start(start))
                .map_err(io(&path))?;
            let mut reader = std::io::BufReader::new(file.take(size.saturating_sub(start)));
            let mut offset = start;
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = reader.read_until(b'\n', &mut line).map_err(io(&path))?;
                if n == 0 || !line.ends_with(b"\n") {
                    break;
                }
                offset += n as u64;
                let Some(entry) = parse(&line[..n - 1]) else {
                    continue;
                };
                if entry.seq <= batch.last {
                    continue;
                }
                bytes += entry.body.len();
                batch.last = entry.seq;
                batch.entries.push(entry);
                stop = Some((batch.last + 1, first, offset));
                if batch.entries.len() >= max as usize || bytes >= max_bytes {
                    break 'segments;
                }
            }
        }
        if stop.is_some() {
            lock(&self.inner).hint = stop;
        }
        debug_assert!(batch.last <= newest);
        Ok(batch)
    }
}

fn parse(line: &[u8]) -> Option<Shipped> {
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.splitn(5, '\t');
    let seq = parts.next()?.parse().ok()?;
    let kind = match parts.next()? {
        "l" => ShippedKind::Log,
        "u" => ShippedKind::Usage,
        _ => return None,
    };
    let sandbox_id = parts.next()?.to_string();
    let time_ms = parts.next()?.parse().ok()?;
    Some(Shipped {
        seq,
        sandbox_id,
        kind,
        time_ms,
        body: parts.next()?.to_string(),
    })
}

/// The seq of the segment's last entry, if it has one.
fn last_seq(path: &Path) -> std::io::Result<Option<u64>> {
    let mut last = None;
    let reader = std::io::BufReader::new(File::open(path)?);
    for line in reader.split(b'\n') {
        if let Some(e) = parse(&line?) {
            last = Some(e.seq);
        }
    }
    Ok(last)
}

/// The journal's id, made once: a new home is a new journal.
fn journal_id(dir: &Path) -> Result<String, JournalError> {
    let path = dir.join("id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        if !id.trim().is_empty() {
            return Ok(id.trim().to_string());
        }
    }
    let id = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|u| u.trim().to_string())
        .unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            format!("{nanos:x}-{:x}", std::process::id())
        });
    // Written whole before any segment: a crash leaves no journal without
    // an id, or an id with entries of another.
    let tmp = dir.join("id.tmp");
    std::fs::write(&tmp, &id).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(id)
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(j: &ShipJournal, sandbox: &str, text: &str) -> u64 {
        j.append(ShippedKind::Log, sandbox, 1, |_| {
            Some(text.as_bytes().to_vec())
        })
        .expect("appended")
        .0
    }

    async fn all(j: &ShipJournal, journal: Option<&str>, after: u64) -> ShipBatch {
        j.read(journal, after, 1_000_000, usize::MAX, Duration::ZERO)
            .await
            .expect("read")
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn numbers_go_on_across_a_reopen_and_a_torn_entry_is_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = ShipJournal::open(dir.path(), 1 << 20).expect("open");
        let id = j.id().to_string();
        assert_eq!(put(&j, "sbx-a", "one"), 1);
        assert_eq!(put(&j, "sbx-b", "two"), 2);
        drop(j);
        // A kill mid-append.
        let seg = dir.path().join(format!("{:020}.ship", 1));
        let mut f = OpenOptions::new().append(true).open(&seg).expect("seg");
        f.write_all(b"3\tl\tsbx-a\t1\t{\"half").expect("write");
        let j = ShipJournal::open(dir.path(), 1 << 20).expect("reopen");
        assert_eq!(j.id(), id, "the same journal");
        assert_eq!(put(&j, "sbx-a", "three"), 3);
        let b = all(&j, Some(&id), 0).await;
        let bodies: Vec<_> = b.entries.iter().map(|e| e.body.as_str()).collect();
        assert_eq!(bodies, ["one", "two", "three"]);
        assert_eq!(b.last, 3);
        assert_eq!(b.entries[1].sandbox_id, "sbx-b");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_reader_resumes_after_its_cursor_in_small_batches_and_another_journal_starts_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Small segments: the reads cross them.
        let j = ShipJournal::open(dir.path(), 64 << 20).expect("open");
        let j = ShipJournal {
            segment_bytes: 4096,
            ..j
        };
        for i in 0..2000 {
            put(&j, "sbx-a", &format!("line {i}"));
        }
        let mut cursor = 0;
        let mut got = Vec::new();
        loop {
            let b = j
                .read(Some(j.id()), cursor, 7, usize::MAX, Duration::ZERO)
                .await
                .expect("read");
            if b.entries.is_empty() {
                break;
            }
            cursor = b.last;
            got.extend(b.entries.into_iter().map(|e| e.body));
        }
        let want: Vec<String> = (0..2000).map(|i| format!("line {i}")).collect();
        assert_eq!(got, want, "every entry once, in order");
        // Acknowledged segments are gone; what remains reads for a caller of
        // another journal from its own start.
        let segments = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".ship"))
            })
            .count();
        assert!(segments <= 2, "{segments} segments kept");
        let other = all(&j, Some("another-journal"), 1999).await;
        assert_eq!(other.journal, j.id());
        assert!(other.dropped > 0, "the acknowledged ones are reported gone");
        assert_eq!(other.last, 2000);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn past_its_bound_the_oldest_go_and_a_reader_is_told() {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = ShipJournal::open(dir.path(), 64 << 10).expect("open");
        let id = j.id().to_string();
        for i in 0..5000 {
            put(&j, "sbx-a", &format!("line {i:05} {}", "x".repeat(40)));
        }
        let b = all(&j, Some(&id), 0).await;
        assert!(b.dropped > 0);
        let first = b.entries.first().expect("entries").seq;
        assert_eq!(first, b.dropped + 1, "the gap is counted exactly");
        assert_eq!(b.last, 5000);
        let on_disk: u64 = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        assert!(on_disk <= (64 << 10) + (64 << 10), "{on_disk}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_reader_waits_for_the_next_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = std::sync::Arc::new(ShipJournal::open(dir.path(), 1 << 20).expect("open"));
        let id = j.id().to_string();
        let writer = j.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            put(&writer, "sbx-a", "late");
        });
        let started = std::time::Instant::now();
        let b = j
            .read(Some(&id), 0, 10, usize::MAX, Duration::from_secs(5))
            .await
            .expect("read");
        assert_eq!(b.entries.len(), 1);
        assert!(started.elapsed() < Duration::from_secs(4));
    }
}
