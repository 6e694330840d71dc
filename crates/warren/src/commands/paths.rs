//! `warren ls`, `mkdir`, `mv` and `rm ID /PATH`: paths in a sandbox,
//! through `POST /v1/sandboxes/{id}/paths`.

use anyhow::{bail, Result};
use warren_node_api::{PathEntry, PathKind, PathOp};

use warren_cli::client::Client;

pub(super) async fn ls(
    client: &Client,
    id: &str,
    path: &str,
    depth: u32,
    json: bool,
) -> Result<i32> {
    let list = |path: &str| PathOp::List {
        path: path.to_string(),
        depth,
    };
    // As `ls -l`: a directory is listed, anything else (a symlink too) is
    // shown itself; a trailing slash lists what a link points to.
    let mut entries = if path.ends_with('/') {
        client.path_op(id, &list(path)).await?
    } else {
        let stat = PathOp::Stat {
            path: path.to_string(),
        };
        let mut found = client.path_op(id, &stat).await?;
        if found.first().is_some_and(|e| e.kind == PathKind::Dir) {
            client.path_op(id, &list(path)).await?
        } else {
            found.truncate(1);
            found
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(0);
    }
    // The API answers in directory order; a person reads sorted names.
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let owner = |e: &PathEntry| format!("{}:{}", e.uid, e.gid);
    let owner_w = entries.iter().map(|e| owner(e).len()).max().unwrap_or(0);
    let size_w = entries
        .iter()
        .map(|e| e.size.to_string().len())
        .max()
        .unwrap_or(0);
    for e in &entries {
        let target = match &e.symlink_target {
            Some(t) => format!(" -> {t}"),
            None => String::new(),
        };
        println!(
            "{} {:<owner_w$} {:>size_w$} {} {}{target}",
            mode_string(e.kind, e.mode),
            owner(e),
            e.size,
            utc_minute(e.modified_ms),
            e.path,
        );
    }
    Ok(0)
}

pub(super) async fn mkdir(client: &Client, id: &str, path: &str) -> Result<i32> {
    let op = PathOp::MakeDir {
        path: path.to_string(),
    };
    client.path_op(id, &op).await?;
    Ok(0)
}

pub(super) async fn mv(client: &Client, id: &str, from: &str, to: &str) -> Result<i32> {
    let op = PathOp::Rename {
        from: from.to_string(),
        to: to.to_string(),
    };
    client.path_op(id, &op).await?;
    Ok(0)
}

pub(super) async fn rm(client: &Client, id: &str, path: &str) -> Result<i32> {
    let op = PathOp::Remove {
        path: path.to_string(),
    };
    client.path_op(id, &op).await?;
    Ok(0)
}

/// What `warren rm ARGS` means: `Some((id, path))` removes a path in a
/// sandbox, `None` destroys the sandboxes named. Sandbox ids never hold a
/// `/`, so an absolute path cannot be mistaken for one; anything that looks
/// like neither is refused before a sandbox is destroyed, since a slip
/// (`warren rm $id tmp/x`) must not cost the whole sandbox.
pub(super) fn removal<'a>(
    args: &'a [String],
    labels: &[String],
) -> Result<Option<(&'a str, &'a str)>> {
    if args.iter().any(|a| a.starts_with('/')) {
        return match args {
            [id, path] if !id.starts_with('/') && labels.is_empty() => Ok(Some((id, path))),
            _ => bail!(
                "`warren rm ID /PATH` removes one path in one sandbox: give the sandbox id, then the \
                 absolute path (to destroy sandboxes, give only their ids or --label)"
            ),
        };
    }
    if let Some(rel) = args.iter().find(|a| a.contains('/')) {
        bail!(
            "{rel} is not a sandbox id, and paths in a sandbox are absolute: `warren rm ID /{rel}`; \
             nothing was removed"
        );
    }
    if args.len() > 1 {
        if let Some(odd) = args.iter().find(|a| !a.starts_with("sbx-")) {
            bail!(
                "{odd} is not a sandbox id (sbx-…), so nothing was destroyed; to remove a path in a \
                 sandbox, give it absolute: `warren rm ID /{odd}`"
            );
        }
    }
    Ok(None)
}

/// `drwxr-xr-x` as `ls -l` writes it, setuid, setgid and sticky bits
/// included; `?` for a device, FIFO or socket (the API does not say which).
fn mode_string(kind: PathKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        PathKind::File => '-',
        PathKind::Dir => 'd',
        PathKind::Symlink => 'l',
        PathKind::Other => '?',
    });
    for (shift, special, set) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (mode & special != 0, bits & 1 != 0) {
            (true, true) => set,
            (true, false) => set.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM` in UTC (the proleptic Gregorian
/// calendar, from H. Hinnant's `civil_from_days`): one line of arithmetic
/// rather than a date library in the CLI.
fn utc_minute(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        day_secs / 3600,
        day_secs % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn modes_read_as_ls_writes_them() {
        assert_eq!(mode_string(PathKind::File, 0o644), "-rw-r--r--");
        assert_eq!(mode_string(PathKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(PathKind::Symlink, 0o777), "lrwxrwxrwx");
        assert_eq!(mode_string(PathKind::Dir, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(PathKind::File, 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(PathKind::File, 0o2644), "-rw-r-Sr--");
        assert_eq!(mode_string(PathKind::Other, 0o600), "?rw-------");
    }

    #[test]
    fn times_are_utc_calendar_minutes() {
        assert_eq!(utc_minute(0), "1970-01-01 00:00");
        // 2024-02-29 13:45:59.999 UTC: a leap day.
        assert_eq!(utc_minute(1_709_214_359_999), "2024-02-29 13:45");
        assert_eq!(utc_minute(951_782_400_000), "2000-02-29 00:00");
        assert_eq!(utc_minute(-60_000), "1969-12-31 23:59");
    }

    #[test]
    fn rm_tells_paths_from_sandboxes() {
        let none: Vec<String> = vec![];
        let a = args(&["sbx-1", "/tmp/x"]);
        assert_eq!(removal(&a, &none).ok().flatten(), Some(("sbx-1", "/tmp/x")));
        assert!(matches!(
            removal(&args(&["sbx-1", "sbx-2"]), &none),
            Ok(None)
        ));
        assert!(matches!(removal(&args(&["sbx-1"]), &none), Ok(None)));
        // A single unknown id is the server's to refuse (it says which).
        assert!(matches!(removal(&args(&["nope"]), &none), Ok(None)));
        // Everything ambiguous is refused before anything is destroyed.
        for bad in [
            &["sbx-1", "tmp/x"][..],
            &["sbx-1", "x"],
            &["sbx-1", "/a", "/b"],
            &["/tmp/x"],
            &["sbx-1", "sbx-2", "/x"],
        ] {
            assert!(removal(&args(bad), &none).is_err(), "{bad:?}");
        }
        assert!(removal(&a, &args(&["task=x"])).is_err());
    }
}
