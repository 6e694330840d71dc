//! Each sandbox's JSON-lines log on the host: `<home>/logs/<id>.jsonl`.
//!
//! One line format for everything:
//! `{"time": RFC3339, "sandbox_id": ID, "kind": "stdout"|"stderr"|"event", ...}`
//! Output lines carry `text` (UTF-8 that JSON can hold compactly) or `data`
//! (base64, for bytes that are not UTF-8 or are mostly control characters,
//! which JSON would spell six times longer). Events carry `state`, `reason`
//! and `message`.
//!
//! A log is capped: when the current file would grow past half the cap it
//! becomes `<id>.jsonl.1` (replacing the older one) and a new file starts,
//! so a sandbox that prints gigabytes keeps only its newest output and
//! never fills the node's disk. Readers see both files, oldest first.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

use warren_core::clock::now_rfc3339;
use warren_core::sync::lock;
use warren_node_api::ShippedKind;

use crate::ship_journal::{now_ms, ShipJournal};

/// Default cap of one sandbox's log on disk (both files together).
pub const DEFAULT_MAX: u64 = 64 << 20;

pub struct SandboxLog {
    id: String,
    path: PathBuf,
    /// Bytes one file may reach before it is rotated (half the cap).
    file_max: u64,
    file: Mutex<Current>,
    /// Bumped after every write, for followers.
    written: watch::Sender<u64>,
    /// The node's shipping journal: every line goes there too, numbered
    /// node-wide (its `seq`), for the control plane to keep.
    ship: Option<Arc<ShipJournal>>,
}

struct Current {
    file: Option<File>,
    size: u64,
    /// The lowest `seq` the current file holds (None: none known, e.g.
    /// after a restart): at a rotation, the lines before it are dropped.
    first_seq: Option<u64>,
}

/// The files of a sandbox's log, oldest first (they may not exist).
pub fn files(dir: &Path, id: &str) -> [PathBuf; 2] {
    [
        dir.join(format!("{id}.jsonl.1")),
        dir.join(format!("{id}.jsonl")),
    ]
}

/// The sandbox id a log file belongs to, from its name.
pub fn owner(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix(".jsonl")
        .or_else(|| file_name.strip_suffix(".jsonl.1"))
}

impl SandboxLog {
    pub fn open(dir: &Path, id: &str, max: u64) -> std::io::Result<SandboxLog> {
        let [_, path] = files(dir, id);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)?;
        let size = crate::torn::drop_torn_line(&file)?;
        Ok(SandboxLog {
            id: id.to_string(),
            path,
            file_max: (max / 2).max(64 << 10),
            file: Mutex::new(Current {
                file: Some(file),
                size,
                first_seq: None,
            }),
            written: watch::Sender::new(0),
            ship: None,
        })
    }

    /// Every line from now on also goes to `journal`, with its `seq`.
    pub fn shipping(mut self, journal: Option<Arc<ShipJournal>>) -> SandboxLog {
        self.ship = journal;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A receiver that changes whenever a line is written.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }

    /// Wakes the followers without a write, for them to ask again whether
    /// the sandbox is over.
    pub fn wake_followers(&self) {
        self.written.send_modify(|n| *n += 1);
    }

    /// The line as written: with its time, sandbox and (when shipped)
    /// node-wide `seq`, and no newline.
    fn line(&self, line: &mut Value, seq: Option<u64>) -> Option<Vec<u8>> {
        if let Some(obj) = line.as_object_mut() {
            obj.insert("time".into(), json!(now_rfc3339()));
            obj.insert("sandbox_id".into(), json!(self.id));
            if let Some(seq) = seq {
                obj.insert("seq".into(), json!(seq));
            }
        }
        serde_json::to_vec(&line).ok()
    }

    fn write(&self, mut line: Value) {
        {
            // Held across the journal's append: this log's lines and its
            // entries there are in the same order.
            let mut cur = lock(&self.file);
            let shipped = self.ship.as_ref().and_then(|j| {
                j.append(ShippedKind::Log, &self.id, now_ms(), |seq| {
                    self.line(&mut line, Some(seq))
                })
            });
            let seq = shipped.as_ref().map(|(seq, _)| *seq);
            let Some(mut text) = shipped
                .map(|(_, body)| body)
                .or_else(|| self.line(&mut line, None))
            else {
                return;
            };
            text.push(b'\n');
            if cur.size > 0 && cur.size + text.len() as u64 > self.file_max {
                self.rotate(&mut cur);
            }
            // A full disk must not take the sandbox down; the log is best effort.
            cur.append(&text);
            if let Some(seq) = seq {
                cur.first_seq = Some(cur.first_seq.map_or(seq, |first| first.min(seq)));
            }
        }
        self.wake_followers();
    }

    /// The current file becomes the older one; a new file starts with a
    /// line that says so.
    fn rotate(&self, cur: &mut Current) {
        let [older, _] = files(self.path.parent().unwrap_or(Path::new(".")), &self.id);
        if std::fs::rename(&self.path, &older).is_err() {
            return;
        }
        cur.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .ok();
        cur.size = 0;
        // Shipped too, saying which lines went: the control plane drops
        // them from its copy, so a sandbox's kept log is capped as its
        // node's is (one printing gigabytes cannot crowd out the others').
        let mut note = json!({
            "kind": "event", "state": null, "reason": "log_rotated",
            "message": format!("the log reached its cap; lines before those in {}.jsonl.1 were dropped", self.id),
        });
        if let Some(first) = cur.first_seq.take() {
            note["dropped_before_seq"] = json!(first);
        }
        let shipped = self.ship.as_ref().and_then(|j| {
            j.append(ShippedKind::Log, &self.id, now_ms(), |seq| {
                self.line(&mut note, Some(seq))
            })
        });
        let seq = shipped.as_ref().map(|(seq, _)| *seq);
        if let Some(mut text) = shipped
            .map(|(_, body)| body)
            .or_else(|| self.line(&mut note, None))
        {
            text.push(b'\n');
            cur.append(&text);
            cur.first_seq = seq;
        }
    }

    pub fn output(&self, stream: &str, exec_id: &str, bytes: &[u8]) {
        let mut line = json!({ "kind": stream, "exec_id": exec_id });
        match std::str::from_utf8(bytes) {
            Ok(text) if compact_in_json(text) => line["text"] = json!(text),
            _ => line["data"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
        self.write(line);
    }

    pub fn event(&self, state: &str, reason: &str, message: &str) {
        self.write(
            json!({ "kind": "event", "state": state, "reason": reason, "message": message }),
        );
    }

    pub fn record(&self, kind: &str, fields: Value) {
        let mut line = json!({ "kind": kind });
        if let (Some(dst), Some(src)) = (line.as_object_mut(), fields.as_object()) {
            for (k, v) in src {
                dst.insert(k.clone(), v.clone());
            }
        }
        self.write(line);
    }
}

impl Current {
    /// Appends one whole line. A line the disk took only part of (it
    /// filled up mid-write) is cut off again, so the next line is not
    /// glued onto it.
    fn append(&mut self, text: &[u8]) {
        let Some(f) = self.file.as_mut() else { return };
        match f.write_all(text) {
            Ok(()) => self.size += text.len() as u64,
            Err(_) => {
                let _ = f.set_len(self.size);
            }
        }
    }
}

/// Whether `text` as a JSON string is no longer than its base64 form:
/// JSON spells a control character as `\u00XX` (six bytes for one), so
/// binary-ish output is stored as base64 (four bytes for three).
fn compact_in_json(text: &str) -> bool {
    let escaped: usize = text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum();
    escaped <= text.len().div_ceil(3) * 4
}

/// How a follower learns that more may come, and when to stop.
pub struct Follow {
    /// Changes when the log is written (absent once the sandbox is gone).
    pub changes: Option<watch::Receiver<u64>>,
    /// Whether the sandbox is over: no more lines are coming.
    pub over: Box<dyn FnMut() -> futures_util::future::BoxFuture<'static, bool> + Send>,
}

/// A follower asks whether the sandbox is over at least this often, even
/// without a notification. Only a backstop: a write, the sandbox's end and
/// its removal all notify, and each wake of an idle follower costs CPU.
const FOLLOW_POLL: Duration = Duration::from_secs(10);

struct Reader {
    pending: VecDeque<PathBuf>,
    open: Option<(tokio::io::BufReader<tokio::fs::File>, u64, PathBuf)>,
    current: PathBuf,
    follow: Option<Follow>,
    finishing: bool,
    /// The open file was rotated away: read it to its end once more (the
    /// writer may have added to it between our last read and the rename),
    /// then move on.
    draining: bool,
}

/// The sandbox's log as a stream of whole lines, oldest first; with
/// `follow`, it stays open until the sandbox is over and everything it
/// wrote has been read, following rotations.
pub fn stream(
    dir: &Path,
    id: &str,
    follow: Option<Follow>,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let [older, current] = files(dir, id);
    let reader = Reader {
        pending: VecDeque::from([older, current.clone()]),
        open: None,
        current,
        follow,
        finishing: false,
        draining: false,
    };
    futures_util::stream::unfold(reader, |mut r| async move {
        loop {
            if r.open.is_none() {
                let Some(path) = r.pending.pop_front() else {
                    if r.follow.is_none() || r.finishing {
                        return None;
                    }
                    // Not created yet, or between a rotation's two steps.
                    r.pending.push_back(r.current.clone());
                    r.wait().await;
                    continue;
                };
                if let Ok(f) = tokio::fs::File::open(&path).await {
                    let ino = f.metadata().await.map(|m| m.ino()).unwrap_or(0);
                    r.open = Some((tokio::io::BufReader::new(f), ino, path));
                }
                continue;
            }
            let Some((reader, ino, path)) = r.open.as_mut() else {
                continue;
            };
            let mut line = Vec::new();
            match reader.read_until(b'\n', &mut line).await {
                Ok(n) if n > 0 && line.ends_with(b"\n") => return Some((Ok(Bytes::from(line)), r)),
                Err(e) => return Some((Err(e), r)),
                _ => {}
            }
            // At the end of this file for now.
            let rotated = *path == r.current
                && std::fs::metadata(&r.current).map(|m| m.ino()).ok() != Some(*ino);
            if rotated && !r.draining && line.is_empty() {
                r.draining = true;
                continue;
            }
            r.draining = false;
            let more = !r.pending.is_empty() || rotated;
            if more || r.follow.is_none() || r.finishing {
                if rotated {
                    r.pending.push_back(r.current.clone());
                }
                r.open = None;
                if !line.is_empty() {
                    return Some((Ok(Bytes::from(line)), r));
                }
                continue;
            }
            if !line.is_empty() {
                // A line being written; give it back whole later.
                let back = line.len() as i64;
                use tokio::io::AsyncSeekExt;
                let _ = reader.seek(std::io::SeekFrom::Current(-back)).await;
            }
            let over = match r.follow.as_mut() {
                Some(f) => (f.over)().await,
                None => true,
            };
            if over {
                // One more pass reads what was written before it ended.
                r.finishing = true;
            } else {
                r.wait().await;
            }
        }
    })
}

impl Reader {
    /// Waits until the file may have changed: a write, the writer gone, or
    /// the sandbox over. Without a write notification the file is as it
    /// was, so an idle follower costs a timer and the `over` question, not
    /// a read (100 idle followers of a debug build spent 4% of a core
    /// re-reading unchanged files).
    async fn wait(&mut self) {
        let Some(follow) = self.follow.as_mut() else {
            return;
        };
        loop {
            let Some(rx) = follow.changes.as_mut() else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                return;
            };
            match tokio::time::timeout(FOLLOW_POLL, rx.changed()).await {
                Ok(Ok(())) => return,
                Ok(Err(_)) => {
                    // The writer is gone (the sandbox ended or was taken
                    // over): from here on only the file tells.
                    follow.changes = None;
                    return;
                }
                Err(_) if (follow.over)().await => return,
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn lines(dir: &Path, id: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for f in files(dir, id) {
            if let Ok(text) = std::fs::read_to_string(f) {
                out.extend(
                    text.lines()
                        .map(|l| serde_json::from_str(l).expect("a JSON line")),
                );
            }
        }
        out
    }

    // Found by a hostile run: a sandbox printing zeros wrote six bytes of
    // log per byte of output, with no cap (600 MB of host log in 5 s).
    #[test]
    fn binary_output_is_not_amplified_and_the_log_is_capped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = SandboxLog::open(dir.path(), "sbx-a", 1 << 20).expect("open");
        let zeros = vec![0u8; 64 << 10];
        for _ in 0..200 {
            log.output("stdout", "main", &zeros);
        }
        let on_disk: u64 = files(dir.path(), "sbx-a")
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        // 12.5 MiB of output, 1 MiB cap.
        assert!(on_disk <= (1 << 20) + (128 << 10), "{on_disk}");
        let all = lines(dir.path(), "sbx-a");
        let last = all.last().expect("lines");
        let data = last["data"].as_str().expect("zeros are stored as base64");
        assert!(data.len() <= zeros.len() * 4 / 3 + 4);
        assert!(all.iter().any(|l| l["reason"] == "log_rotated"));
        // Text stays text.
        log.output("stdout", "main", b"hello\tworld\n");
        assert_eq!(
            lines(dir.path(), "sbx-a").last().expect("line")["text"],
            "hello\tworld\n"
        );
    }

    // Found by the fault-injection suite: a daemon killed mid-write left half
    // a line, and the next daemon's first line was glued to it.
    #[test]
    fn a_torn_last_line_is_cut_off_when_the_log_is_opened_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sbx-c.jsonl");
        std::fs::write(&path, "{\"kind\":\"event\"}\n{\"kind\":\"stdo").expect("write");
        let log = SandboxLog::open(dir.path(), "sbx-c", 1 << 20).expect("open");
        log.event("running", "adopted", "");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for l in lines {
            serde_json::from_str::<Value>(l).expect("every line is JSON");
        }
    }

    #[tokio::test]
    async fn a_follower_reads_across_a_rotation_without_losing_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log =
            std::sync::Arc::new(SandboxLog::open(dir.path(), "sbx-b", 256 << 10).expect("open"));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        let follow = Follow {
            changes: Some(log.subscribe()),
            over: Box::new(move || {
                let d = d.clone();
                Box::pin(async move { d.load(std::sync::atomic::Ordering::SeqCst) })
            }),
        };
        let reader = tokio::spawn({
            let dir = dir.path().to_path_buf();
            async move {
                stream(&dir, "sbx-b", Some(follow))
                    .map(|l| l.expect("a line"))
                    .collect::<Vec<_>>()
                    .await
            }
        });
        // Slow enough for the follower to keep up with the rotations.
        for i in 0..3000 {
            log.output(
                "stdout",
                "main",
                format!("line {i} {}\n", "x".repeat(100)).as_bytes(),
            );
            if i % 100 == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        log.wake_followers();
        let got = reader.await.expect("reader");
        let texts: Vec<String> = got
            .iter()
            .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
            .filter_map(|v| v["text"].as_str().map(String::from))
            .collect();
        assert_eq!(texts.len(), 3000, "every line, in order, once");
        for (i, t) in texts.iter().enumerate() {
            assert!(t.starts_with(&format!("line {i} ")), "{i}: {t}");
        }
    }
}
