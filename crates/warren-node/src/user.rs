//! Resolves the user a process runs as: `uid[:gid]` or a name looked up in
//! the sandbox's own /etc/passwd (read through the confined file API).

use std::io::Read;
use std::os::fd::OwnedFd;

use warren_runtime::files;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

pub fn resolve(root: &OwnedFd, user: &str) -> Result<User, String> {
    let user = user.trim();
    if user.is_empty() || user == "root" {
        return Ok(User { uid: 0, gid: 0 });
    }
    let (name, group) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let passwd = read_small(root, "/etc/passwd");
    let (uid, default_gid) = match name.parse::<u32>() {
        Ok(uid) => (
            uid,
            lookup(&passwd, |f| f[2] == name).map_or(uid, |f| parse_id(f[3])),
        ),
        Err(_) => {
            let f = lookup(&passwd, |f| f[0] == name).ok_or_else(|| {
                format!("user {name:?} is not in the image's /etc/passwd; use a numeric uid")
            })?;
            (parse_id(f[2]), parse_id(f[3]))
        }
    };
    let gid = match group {
        None => default_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = read_small(root, "/etc/group");
                lookup(&groups, |f| f[0] == g)
                    .map(|f| parse_id(f[2]))
                    .ok_or_else(|| format!("group {g:?} is not in the image's /etc/group"))?
            }
        },
    };
    Ok(User { uid, gid })
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
