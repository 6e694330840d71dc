//! The node's own record of its sandboxes, `<home>/node/sandboxes/<id>.json`:
//! what it needs to take each one over again after it restarts, without
//! asking the control plane (which may be far away, or restarting too).
//! An entry of at most a page that replaces one of at most a page (a pool
//! claim, a phase change) is written over it in place by one write at
//! offset 0, padded with spaces (which JSON allows) to the old length so
//! the file never shrinks: a process killed during such a write finishes
//! its copy into the page or never starts it. Any other entry is written
//! whole to a temporary file, the old entry removed and the new one
//! renamed into place: a crash leaves the old entry, the new one, or
//! (between the two steps) the new one under its temporary name, which
//! `load` takes when the entry itself is gone. Never renamed over the old
//! one, nor truncated: ext4 (`auto_da_alloc`) starts writing a file back
//! at once when it replaces another by a rename or was truncated to
//! nothing, which made every rewrite 0.3 ms slower.
//!
//! Not synced: an entry matters only while its sandbox's processes live,
//! and what kills the kernel's page cache (a power cut, a reboot) kills
//! them too.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use warren_core::sync::lock;

use serde::{Deserialize, Serialize};
use warren_node_api::{CreateSandbox, Phase};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub create: CreateSandbox,
    /// Host PID of its init.
    pub pid: i32,
    pub phase: Phase,
    /// When its TTL (or its hold) ends, in ms on CLOCK_BOOTTIME.
    pub ends_boot_ms: i64,
}

pub struct Journal {
    dir: PathBuf,
    /// One write at a time: two of one entry at once would mix.
    writing: Mutex<()>,
}

/// The most an entry rewritten in place may hold (a page).
const IN_PLACE_AT_MOST: usize = 4096;

impl Journal {
    pub fn open(home: &Path) -> std::io::Result<Journal> {
        let dir = home.join("node").join("sandboxes");
        std::fs::create_dir_all(&dir)?;
        Ok(Journal {
            dir,
            writing: Mutex::new(()),
        })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub fn write(&self, e: &Entry) -> std::io::Result<()> {
        let path = self.path(&e.create.id);
        let mut body = serde_json::to_vec(e).map_err(std::io::Error::other)?;
        let _one = lock(&self.writing);
        if rewrite_in_place(&path, &mut body)? {
            return Ok(());
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::File::create(&tmp)?.write_all(&body)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::rename(&tmp, &path)
    }

    pub fn remove(&self, id: &str) {
        let _ = std::fs::remove_file(self.path(id));
    }

    /// Every entry that can be read; unreadable ones are reported, not fatal
    /// (their sandboxes are swept as orphans).
    pub fn load(&self) -> Vec<Entry> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        let mut entries = Vec::new();
        for path in &paths {
            if path.extension().and_then(|x| x.to_str()) == Some("json") {
                entries.push(path.clone());
                continue;
            }
            // A whole new entry whose old one was removed just before a
            // crash: it is the entry. Beside its entry, a half-written one.
            let entry = path.with_extension("");
            let taken = entry.extension().and_then(|x| x.to_str()) == Some("json")
                && path.extension().and_then(|x| x.to_str()) == Some("tmp")
                && !paths.contains(&entry)
                && std::fs::rename(path, &entry).is_ok();
            if taken {
                entries.push(entry);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
        let mut out = Vec::new();
        for path in entries {
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Entry>(&b).map_err(|e| e.to_string()))
            {
                Ok(entry) => out.push(entry),
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "unreadable journal entry; its sandbox is swept");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        out
    }
}

/// Writes `body` over the entry at `path` when both fit in a page; false
/// when there is no entry yet or either is larger.
fn rewrite_in_place(path: &Path, body: &mut Vec<u8>) -> std::io::Result<bool> {
    if body.len() > IN_PLACE_AT_MOST {
        return Ok(false);
    }
    let file = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let old = file.metadata()?.len() as usize;
    if old > IN_PLACE_AT_MOST {
        return Ok(false);
    }
    body.resize(old.max(body.len()), b' ');
    file.write_all_at(body, 0)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_written_whole_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = Journal::open(dir.path()).expect("open");
        let spec: warren_core::SandboxSpec =
            serde_json::from_str(r#"{"image":"a"}"#).expect("spec");
        let e = Entry {
            create: CreateSandbox {
                id: "sbx-aaaaaaaaaaaa".into(),
                resources: spec.resolve().expect("resolves"),
                spec,
                image_digest: "sha256:00".into(),
                image_source: None,
                devices: vec!["test.example/gpu=0".into()],
                device_env: [("TEST_GPU".to_string(), "0".to_string())].into(),
                secrets: vec![warren_core::secret::Resolved {
                    delivery: warren_core::secret::Delivery::Env(
                        "TOKEN".to_string().try_into().expect("env name"),
                    ),
                    value: "v".into(),
                }],
            },
            pid: 42,
            phase: Phase::Running,
            ends_boot_ms: 1000,
        };
        j.write(&e).expect("write");
        std::fs::write(dir.path().join("node/sandboxes/sbx-bad.json"), b"{").expect("write");
        std::fs::write(dir.path().join("node/sandboxes/x.json.tmp"), b"half").expect("write");
        assert_eq!(j.load(), vec![e.clone()]);
        j.remove("sbx-aaaaaaaaaaaa");
        assert!(j.load().is_empty());

        // A crash between removing an entry and renaming its successor
        // into place: the successor, whole under its temporary name, is it.
        let dir = dir.path().join("node/sandboxes");
        std::fs::write(
            dir.join("sbx-aaaaaaaaaaaa.json.tmp"),
            serde_json::to_vec(&e).expect("json"),
        )
        .expect("write");
        assert_eq!(j.load(), vec![e.clone()]);
        assert!(dir.join("sbx-aaaaaaaaaaaa.json").exists());
        // Beside its entry, a temporary file is a half-written successor.
        std::fs::write(dir.join("sbx-aaaaaaaaaaaa.json.tmp"), b"{\"cre").expect("write");
        assert_eq!(j.load(), vec![e.clone()]);
        assert!(!dir.join("sbx-aaaaaaaaaaaa.json.tmp").exists());
        // Rewrites replace the entry: in place, shorter and longer; then
        // past a page, through a temporary file; then back within one.
        use std::os::unix::fs::MetadataExt;
        let inode = || {
            std::fs::metadata(dir.join("sbx-aaaaaaaaaaaa.json"))
                .expect("entry")
                .ino()
        };
        let mut later = e.clone();
        for (env, in_place) in [
            (0, true),
            (3000, true),
            (10, true),
            (5000, false),
            (0, false),
        ] {
            let before = inode();
            later.create.spec.env = [("PAD".to_string(), "x".repeat(env))].into();
            j.write(&later).expect("rewrite");
            assert_eq!(j.load(), vec![later.clone()], "env of {env}");
            assert_eq!(inode() == before, in_place, "env of {env}");
        }
    }
}
