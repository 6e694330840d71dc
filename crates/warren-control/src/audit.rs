//! The audit log: one JSON line per call that changes something, in
//! `<home>/audit/YYYY-MM-DD.jsonl` (UTC days), written before the call's
//! answer goes out, so an answered call is in the log even if the server
//! dies the moment after (the line is in the kernel's page cache; a power
//! loss may take the last lines, as it may the daemon's own log). Files
//! older than [`KEEP_DAYS`] are removed when a new day's file is begun.
//!
//! Each server logs the calls it answered: in a cluster, where the replicas
//! forward writes to the leader, the leader's home holds them, and a query
//! answers from the home of the server asked.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use time::format_description::well_known::Rfc3339;
use warren_core::audit::AuditEntry;
use warren_core::sync::lock;
use warren_core::tenant::TenantName;
use warren_core::ApiError;

/// Days of audit files kept.
pub const KEEP_DAYS: u64 = 90;

/// The most lines one query answers.
pub const MAX_ANSWER: usize = 10_000;

pub struct Audit {
    /// `<home>/audit`; None: not kept (a control plane without a home, in
    /// tests of its own).
    dir: Option<PathBuf>,
    /// The open day's file and its day.
    open: Mutex<Option<(String, std::fs::File)>>,
}

/// What a query of the log asks for.
#[derive(Debug, Default, Clone)]
pub struct AuditQuery {
    pub tenant: Option<TenantName>,
    /// Lines at or after `since` and before `until`.
    pub since: Option<time::OffsetDateTime>,
    pub until: Option<time::OffsetDateTime>,
    pub limit: Option<usize>,
}

impl Audit {
    pub(crate) fn new(home: Option<&Path>) -> Audit {
        Audit {
            dir: home.map(|h| h.join("audit")),
            open: Mutex::new(None),
        }
    }

    /// Appends one line. A line that cannot be written is logged, and the
    /// call it records still answers: the audit log must not take the API
    /// down with a full disk.
    pub fn record(&self, entry: &AuditEntry) {
        let Some(dir) = &self.dir else { return };
        if let Err(e) = self.append(dir, entry) {
            tracing::error!(error = %e, "writing the audit log");
        }
    }

    fn append(&self, dir: &Path, entry: &AuditEntry) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let day = entry.time.get(..10).unwrap_or("unknown").to_string();
        let mut open = lock(&self.open);
        if open.as_ref().is_none_or(|(d, _)| *d != day) {
            std::fs::create_dir_all(dir)?;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("{day}.jsonl")))?;
            *open = Some((day.clone(), file));
            expire(dir, &day);
        }
        match open.as_mut() {
            // One write per line: O_APPEND keeps lines whole and in order.
            Some((_, file)) => file.write_all(&line),
            None => Ok(()),
        }
    }

    /// The lines that match, oldest first, at most `limit` (the newest).
    pub fn query(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>, ApiError> {
        let Some(dir) = &self.dir else {
            return Ok(Vec::new());
        };
        let mut days: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(ApiError::internal(format!("reading the audit log: {e}"))),
        };
        days.sort();
        let day_of = |p: &Path| {
            p.file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string()
        };
        let limit = q.limit.unwrap_or(1000).clamp(1, MAX_ANSWER);
        let day_text = |t: time::OffsetDateTime| {
            let d = t.to_offset(time::UtcOffset::UTC).date();
            format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
        };
        let (first_day, last_day) = (q.since.map(day_text), q.until.map(day_text));
        let mut out = Vec::new();
        for path in days {
            let day = day_of(&path);
            // Whole days outside the window are not read.
            if first_day.as_ref().is_some_and(|f| &day < f)
                || last_day.as_ref().is_some_and(|l| &day > l)
            {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ApiError::internal(format!("reading {}: {e}", path.display())))?;
            for line in text.lines() {
                let Ok(entry) = serde_json::from_str::<AuditEntry>(line) else {
                    continue;
                };
                // Compared as times: RFC 3339 texts with and without a
                // fraction of a second do not sort as text.
                let at = time::OffsetDateTime::parse(&entry.time, &Rfc3339).ok();
                let keep = q.tenant.as_ref().is_none_or(|t| &entry.tenant == t)
                    && q.since.is_none_or(|s| at.is_some_and(|a| a >= s))
                    && q.until.is_none_or(|u| at.is_some_and(|a| a < u));
                if keep {
                    out.push(entry);
                }
            }
        }
        let skip = out.len().saturating_sub(limit);
        Ok(out.split_off(skip))
    }
}

/// Removes the day files older than [`KEEP_DAYS`] before `today`.
fn expire(dir: &Path, today: &str) {
    let Some(cutoff) = days_before(today, KEEP_DAYS) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let old = path
            .file_stem()
            .and_then(|s| s.to_str())
            .is_some_and(|d| d.len() == 10 && *d < *cutoff);
        if old && path.extension().is_some_and(|x| x == "jsonl") {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// `YYYY-MM-DD` `days` before `day`.
fn days_before(day: &str, days: u64) -> Option<String> {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    let date = time::Date::parse(day, &format).ok()?;
    let before = date.checked_sub(time::Duration::days(i64::try_from(days).ok()?))?;
    before.format(&format).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_arithmetic_crosses_months_years_and_leap_days() {
        assert_eq!(days_before("2026-03-01", 1).as_deref(), Some("2026-02-28"));
        assert_eq!(days_before("2024-03-01", 1).as_deref(), Some("2024-02-29"));
        assert_eq!(days_before("2027-01-05", 90).as_deref(), Some("2026-10-07"));
        assert_eq!(days_before("nonsense", 1), None);
    }

    #[test]
    fn lines_are_kept_per_day_queried_by_tenant_and_time_and_old_days_expire() {
        let home = std::env::temp_dir().join(format!("warren-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let a = Audit::new(Some(&home));
        let line = |time: &str, tenant: &str| AuditEntry {
            time: time.into(),
            tenant: tenant.parse().unwrap(),
            token: "tok-1".into(),
            door: "api".into(),
            method: "POST".into(),
            route: "/v1/sandboxes".into(),
            target: String::new(),
            status: 201,
        };
        std::fs::create_dir_all(home.join("audit")).unwrap();
        std::fs::write(home.join("audit/2026-01-01.jsonl"), "{}\n").unwrap();
        a.record(&line("2026-06-01T10:00:00Z", "a"));
        a.record(&line("2026-06-02T10:00:00Z", "b"));
        a.record(&line("2026-06-02T11:00:00Z", "a"));
        assert!(!home.join("audit/2026-01-01.jsonl").exists(), "expired");
        let q = |tenant: Option<&str>, since: Option<&str>| {
            a.query(&AuditQuery {
                tenant: tenant.map(|t| t.parse().unwrap()),
                since: since.map(|s| time::OffsetDateTime::parse(s, &Rfc3339).unwrap()),
                ..Default::default()
            })
            .unwrap()
            .into_iter()
            .map(|e| e.time)
            .collect::<Vec<_>>()
        };
        assert_eq!(
            q(Some("a"), None),
            ["2026-06-01T10:00:00Z", "2026-06-02T11:00:00Z"]
        );
        assert_eq!(
            q(None, Some("2026-06-02T10:30:00Z")),
            ["2026-06-02T11:00:00Z"]
        );
        let _ = std::fs::remove_dir_all(&home);
    }
}
