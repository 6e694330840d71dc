//! Each sandbox's JSON-lines log on the host: `<home>/logs/<id>.jsonl`.
//!
//! One line format for everything:
//! `{"time": RFC3339, "sandbox_id": ID, "kind": "stdout"|"stderr"|"event", ...}`
//! Output lines carry `text` (UTF-8) or, for bytes that are not UTF-8, `data`
//! (base64). Events carry `state`, `reason` and `message`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine;
use serde_json::{json, Value};

use crate::clock::now_rfc3339;

pub struct SandboxLog {
    id: String,
    path: PathBuf,
    file: Mutex<Option<File>>,
}

impl SandboxLog {
    pub fn open(dir: &Path, id: &str) -> std::io::Result<SandboxLog> {
        let path = dir.join(format!("{id}.jsonl"));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(SandboxLog {
            id: id.to_string(),
            path,
            file: Mutex::new(Some(file)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, mut line: Value) {
        if let Some(obj) = line.as_object_mut() {
            obj.insert("time".into(), json!(now_rfc3339()));
            obj.insert("sandbox_id".into(), json!(self.id));
        }
        let Ok(mut text) = serde_json::to_vec(&line) else {
            return;
        };
        text.push(b'\n');
        if let Ok(mut guard) = self.file.lock() {
            if let Some(f) = guard.as_mut() {
                // A full disk must not take the sandbox down; the log is best effort.
                let _ = f.write_all(&text);
            }
        }
    }

    pub fn output(&self, stream: &str, exec_id: &str, bytes: &[u8]) {
        let mut line = json!({ "kind": stream, "exec_id": exec_id });
        match std::str::from_utf8(bytes) {
            Ok(text) => line["text"] = json!(text),
            Err(_) => line["data"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes)),
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
