//! Resolves the user a process runs as: `uid[:gid]` or a name looked up in
//! the sandbox's own /etc/passwd (read through the confined file API).

use std::io::Read;
use std::os::fd::OwnedFd;

use thiserror::Error;
use warren_runtime::files;

/// A user or group named by a name the image does not know.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum UserError {
    #[error("user {0:?} is not in the image's /etc/passwd; use a numeric uid")]
    NoSuchUser(String),
    #[error("group {0:?} is not in the image's /etc/group")]
    NoSuchGroup(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// The account's name and home in /etc/passwd, if it has an entry
    /// (root: `root` and `/root`).
    pub name: Option<String>,
    pub home: Option<String>,
}

pub fn resolve(root: &OwnedFd, user: &str) -> Result<User, UserError> {
    let user = user.trim();
    if user.is_empty() || user == "root" {
        // Root's account is the same everywhere; an exec as root (the
        // common case, on the path every exec takes) reads no file.
        return Ok(User {
            uid: 0,
            gid: 0,
            name: Some("root".into()),
            home: Some("/root".into()),
        });
    }
    let passwd = read_small(root, "/etc/passwd");
    let (name, group) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let entry = match name.parse::<u32>() {
        Ok(_) => lookup(&passwd, |f| f[2] == name),
        Err(_) => Some(
            lookup(&passwd, |f| f[0] == name)
                .ok_or_else(|| UserError::NoSuchUser(name.to_string()))?,
        ),
    };
    let uid = match name.parse::<u32>() {
        Ok(uid) => uid,
        Err(_) => entry.as_ref().map_or(0, |f| parse_id(f[2])),
    };
    let default_gid = entry.as_ref().map_or(uid, |f| parse_id(f[3]));
    let (account, home) = match &entry {
        Some(f) => (Some(f[0].to_string()), f.get(5).map(|h| h.to_string())),
        None => (None, None),
    };
    let gid = match group {
        None => default_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = read_small(root, "/etc/group");
                lookup(&groups, |f| f[0] == g)
                    .map(|f| parse_id(f[2]))
                    .ok_or_else(|| UserError::NoSuchGroup(g.to_string()))?
            }
        },
    };
    Ok(User {
        uid,
        gid,
        name: account,
        home: home.filter(|h| h.starts_with('/')),
    })
}

impl User {
    /// `cwd` with a leading `~` made the home directory (`/` without one).
    pub fn expand(&self, cwd: &str) -> String {
        let home = self.home.as_deref().unwrap_or("/");
        match cwd.strip_prefix('~') {
            Some("") => home.to_string(),
            Some(rest) if rest.starts_with('/') => {
                format!("{}{rest}", home.trim_end_matches('/'))
            }
            _ => cwd.to_string(),
        }
    }

    /// What a login sets from /etc/passwd: `HOME`, `USER`, `LOGNAME`.
    pub fn login_env(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(home) = &self.home {
            out.push(("HOME", home.clone()));
        }
        if let Some(name) = &self.name {
            out.push(("USER", name.clone()));
            out.push(("LOGNAME", name.clone()));
        }
        out
    }
}

fn parse_id(s: &str) -> u32 {
    s.parse().unwrap_or(u32::MAX - 1)
}

fn read_small(root: &OwnedFd, path: &str) -> String {
    let mut text = String::new();
    if let Ok(files::Entry::File(f, _)) = files::open_read(root, path) {
        let _ = f.take(1 << 20).read_to_string(&mut text);
    }
    text
}

fn lookup(db: &str, pred: impl Fn(&[&str]) -> bool) -> Option<Vec<&str>> {
    db.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && pred(f))
}
