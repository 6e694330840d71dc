//! Reading what sandboxes said and what happened to them: `logs` and
//! `events`.

use std::io::Write;

use anyhow::Result;
use base64::Engine;

use warren_cli::client::{Client, EventQuery};

/// How a log is shown.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Shown {
    /// The main process's output as raw bytes (what `warren run` prints).
    Output,
    /// Time, stream and text, output coalesced into whole lines.
    Readable,
    /// The JSON lines as stored.
    Json,
}

/// Streams a sandbox log until the sandbox ends.
pub(super) async fn follow_log(client: &Client, id: &str, shown: Shown) -> Result<()> {
    let mut lines = client.follow_sandbox_log(id).await?;
    let mut readable = Readable::new(false);
    while let Some(line) = lines.next_line().await? {
        if shown != Shown::Output {
            print_line(shown, &mut readable, &line)?;
            continue;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
            continue;
        };
        let bytes = match (v["text"].as_str(), v["data"].as_str()) {
            (Some(t), _) => t.as_bytes().to_vec(),
            (None, Some(d)) => base64::engine::general_purpose::STANDARD
                .decode(d)
                .unwrap_or_default(),
            _ => continue,
        };
        match v["kind"].as_str() {
            Some("stdout") => {
                std::io::stdout().write_all(&bytes)?;
                std::io::stdout().flush()?;
            }
            Some("stderr") => std::io::stderr().write_all(&bytes)?,
            _ => {}
        }
    }
    Ok(())
}

pub(super) async fn logs(client: &Client, id: &str, follow: bool, json: bool) -> Result<i32> {
    let shown = if json { Shown::Json } else { Shown::Readable };
    if follow {
        follow_log(client, id, shown).await?;
    } else {
        print_all(shown, &client.sandbox_log(id).await?, false)?;
    }
    Ok(0)
}

/// `warren logs --label`: the logs of every matching sandbox.
pub(super) async fn logs_by_label(
    client: &Client,
    label: &[String],
    since: Option<&str>,
    json: bool,
) -> Result<i32> {
    let shown = if json { Shown::Json } else { Shown::Readable };
    print_all(shown, &client.logs_by_label(label, since).await?, true)?;
    Ok(0)
}

/// `warren logs ID --usage`: the usage samples kept of the sandbox, as
/// JSON lines.
pub(super) async fn usage(client: &Client, id: &str) -> Result<i32> {
    std::io::stdout().write_all(&client.sandbox_usage_history(id).await?)?;
    Ok(0)
}

fn print_all(shown: Shown, text: &[u8], with_ids: bool) -> Result<()> {
    let mut readable = Readable::new(with_ids);
    for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        print_line(shown, &mut readable, line)?;
    }
    print_readable(readable.finish())
}

fn print_line(shown: Shown, readable: &mut Readable, line: &[u8]) -> Result<()> {
    if shown == Shown::Json {
        std::io::stdout().write_all(line)?;
        std::io::stdout().write_all(b"\n")?;
        return Ok(std::io::stdout().flush()?);
    }
    print_readable(readable.push(line))
}

fn print_readable(lines: Vec<String>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}")?;
    }
    Ok(out.flush()?)
}

/// A log's JSON lines as a person reads them: `TIME STREAM TEXT`, the
/// chunks a process wrote joined into whole lines (a terminal's echo comes
/// a keystroke at a time), events and records on a line each.
pub(super) struct Readable {
    with_ids: bool,
    /// Output not yet ended by a newline: its sandbox, stream, exec and
    /// the time it began.
    pending: Option<(String, String, String, String, String)>,
}

impl Readable {
    pub(super) fn new(with_ids: bool) -> Readable {
        Readable {
            with_ids,
            pending: None,
        }
    }

    /// The whole lines `line` completes (and what it flushes).
    pub(super) fn push(&mut self, line: &[u8]) -> Vec<String> {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            return vec![String::from_utf8_lossy(line).into_owned()];
        };
        let time = v["time"].as_str().unwrap_or("").to_string();
        let sandbox = v["sandbox_id"].as_str().unwrap_or("").to_string();
        let kind = v["kind"].as_str().unwrap_or("?").to_string();
        let mut out = Vec::new();
        if kind == "stdout" || kind == "stderr" {
            let exec = v["exec_id"].as_str().unwrap_or("").to_string();
            let text = match (v["text"].as_str(), v["data"].as_str()) {
                (Some(t), _) => t.to_string(),
                (None, Some(d)) => String::from_utf8_lossy(
                    &base64::engine::general_purpose::STANDARD
                        .decode(d)
                        .unwrap_or_default(),
                )
                .into_owned(),
                _ => String::new(),
            };
            let same = self
                .pending
                .as_ref()
                .is_some_and(|(s, k, e, _, _)| (s, k, e) == (&sandbox, &kind, &exec));
            if !same {
                out.extend(self.finish());
            }
            let (_, _, _, started, buf) = self.pending.get_or_insert_with(|| {
                (
                    sandbox.clone(),
                    kind.clone(),
                    exec.clone(),
                    time.clone(),
                    String::new(),
                )
            });
            buf.push_str(&text);
            while let Some(i) = buf.find('\n') {
                let whole: String = buf.drain(..=i).collect();
                let stream = stream_name(&kind, &exec);
                out.push(shown(
                    self.with_ids,
                    &sandbox,
                    started,
                    &stream,
                    whole.trim_end_matches(['\n', '\r']),
                ));
                *started = time.clone();
            }
            if buf.is_empty() {
                self.pending = None;
            }
            return out;
        }
        out.extend(self.finish());
        let text = if kind == "event" {
            let mut t = format!(
                "{} {}",
                v["state"].as_str().unwrap_or("-"),
                v["reason"].as_str().unwrap_or("-")
            );
            if let Some(m) = v["message"].as_str().filter(|m| !m.is_empty()) {
                t.push_str(": ");
                t.push_str(m);
            }
            t
        } else {
            let mut rest = v.clone();
            if let Some(o) = rest.as_object_mut() {
                for k in ["time", "sandbox_id", "kind"] {
                    o.remove(k);
                }
            }
            rest.to_string()
        };
        out.push(shown(self.with_ids, &sandbox, &time, &kind, &text));
        out
    }

    /// Output left without a final newline, as a line of its own.
    pub(super) fn finish(&mut self) -> Vec<String> {
        match self.pending.take() {
            Some((sandbox, kind, exec, time, buf)) if !buf.is_empty() => {
                vec![shown(
                    self.with_ids,
                    &sandbox,
                    &time,
                    &stream_name(&kind, &exec),
                    &buf,
                )]
            }
            _ => Vec::new(),
        }
    }
}

/// One readable line.
fn shown(with_ids: bool, sandbox: &str, time: &str, what: &str, text: &str) -> String {
    // To the millisecond: RFC 3339's first 23 characters, and its zone.
    let time = match (time.get(..23), time.ends_with('Z')) {
        (Some(t), true) => format!("{t}Z"),
        _ => time.to_string(),
    };
    if with_ids {
        format!("{sandbox} {time} {what:<6} {text}")
    } else {
        format!("{time} {what:<6} {text}")
    }
}

/// `stdout` for the main process, `stdout[EXEC]` for an exec's output.
fn stream_name(kind: &str, exec: &str) -> String {
    if exec.is_empty() || exec == "main" {
        kind.to_string()
    } else {
        format!("{kind}[{exec}]")
    }
}

pub(super) async fn events(
    client: &Client,
    sandbox: Option<String>,
    label: Vec<String>,
    batch: Option<String>,
    kind: Option<String>,
    follow: bool,
) -> Result<i32> {
    let query = EventQuery {
        sandbox,
        labels: label,
        batch,
        kind,
    };
    if follow {
        let mut lines = client.follow_events(&query).await?;
        while let Some(line) = lines.next_line().await? {
            std::io::stdout().write_all(&line)?;
            std::io::stdout().write_all(b"\n")?;
            std::io::stdout().flush()?;
        }
    } else {
        let evs = client.events(&query).await?;
        for e in evs {
            println!("{e}");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::Readable;

    #[test]
    fn output_is_joined_into_lines_and_events_are_lines_of_their_own() {
        let mut r = Readable::new(false);
        let t = "2026-12-06T09:00:00.123456Z";
        let mut out = Vec::new();
        for line in [
            format!(r#"{{"time":"{t}","kind":"stdout","exec_id":"","text":"he"}}"#),
            format!(r#"{{"time":"{t}","kind":"stdout","exec_id":"","text":"llo\nwor"}}"#),
            format!(r#"{{"time":"{t}","kind":"stderr","exec_id":"e1","text":"oops\n"}}"#),
            format!(
                r#"{{"time":"{t}","kind":"event","state":"destroyed","reason":"exited","message":""}}"#
            ),
        ] {
            out.extend(r.push(line.as_bytes()));
        }
        out.extend(r.finish());
        let t = "2026-12-06T09:00:00.123Z";
        assert_eq!(
            out,
            [
                format!("{t} stdout hello"),
                format!("{t} stdout wor"),
                format!("{t} stderr[e1] oops"),
                format!("{t} event  destroyed exited"),
            ]
        );
    }
}
