//! A sandbox's accounts as E2B calls need them: who a call that names no
//! user acts as, and the names envd shows for file owners. envd runs
//! everything as its template's user, `user` (home `/home/user`), and
//! E2B's SDKs since envd 0.4 leave the choice to it; so does Warren for a
//! sandbox whose image has that account, and root where it has none (an
//! image that is not an E2B template). Read once per sandbox from its
//! /etc/passwd and /etc/group (accounts added later show by number).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use warren_control::Control;
use warren_core::sync::lock;

/// E2B's default user.
pub const E2B_USER: &str = "user";

/// Sandboxes remembered at most (a sandbox id is never reused, so a
/// forgotten one is only read again).
const REMEMBERED: usize = 65_536;

/// One sandbox's accounts.
#[derive(Debug, Default)]
pub struct Accounts {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
    /// The image's user (its config's `User`, as a template's last
    /// `USER` sets it), else `user` when the image has it; None: root.
    pub default_user: Option<String>,
    /// Where a process starts unless told: the image's working directory
    /// (a template's last `WORKDIR`); None: the user's home.
    pub workdir: Option<String>,
}

impl Accounts {
    fn parse(passwd: &str, group: &str) -> Accounts {
        let ids = |text: &str| -> HashMap<u32, String> {
            let mut out = HashMap::new();
            for line in text.lines() {
                let f: Vec<&str> = line.split(':').collect();
                if let (Some(name), Some(Ok(id))) = (f.first(), f.get(2).map(|i| i.parse())) {
                    out.entry(id).or_insert_with(|| name.to_string());
                }
            }
            out
        };
        let users = ids(passwd);
        let default_user = users
            .values()
            .any(|n| n == E2B_USER)
            .then(|| E2B_USER.to_string());
        Accounts {
            users,
            groups: ids(group),
            default_user,
            workdir: None,
        }
    }

    /// Takes the image config's user and working directory over the
    /// defaults.
    fn with_image(mut self, user: &str, workdir: &str) -> Accounts {
        let name = user.split(':').next().unwrap_or_default();
        match name {
            "" => {}
            "root" | "0" => self.default_user = None,
            n => {
                self.default_user = Some(match n.parse::<u32>() {
                    Ok(id) => self.user_name(id),
                    Err(_) => n.to_string(),
                })
            }
        }
        self.workdir = Some(workdir.to_string()).filter(|w| w.starts_with('/'));
        self
    }

    /// The name of uid `id` (its number when it has none; root always).
    pub fn user_name(&self, id: u32) -> String {
        name(&self.users, id)
    }

    /// The name of gid `id`.
    pub fn group_name(&self, id: u32) -> String {
        name(&self.groups, id)
    }
}

fn name(names: &HashMap<u32, String>, id: u32) -> String {
    match names.get(&id) {
        Some(n) => n.clone(),
        None if id == 0 => "root".into(),
        None => id.to_string(),
    }
}

/// Each sandbox's accounts, once read.
#[derive(Default)]
pub struct SandboxAccounts {
    known: Mutex<HashMap<String, Arc<Accounts>>>,
    /// Each image's (user, working directory), by digest: read once, not
    /// once per sandbox.
    images: Mutex<HashMap<String, (String, String)>>,
}

impl SandboxAccounts {
    pub async fn of(&self, control: &Control, id: &str) -> Arc<Accounts> {
        if let Some(known) = lock(&self.known).get(id) {
            return known.clone();
        }
        let passwd = read_small(control, id, "/etc/passwd").await;
        let group = read_small(control, id, "/etc/group").await;
        let (user, workdir) = self.image_defaults(control, id).await;
        let accounts = Arc::new(Accounts::parse(&passwd, &group).with_image(&user, &workdir));
        let mut known = lock(&self.known);
        if known.len() >= REMEMBERED {
            known.clear();
        }
        known.insert(id.to_string(), accounts.clone());
        accounts
    }
}

impl SandboxAccounts {
    /// The user and working directory the sandbox's image config names
    /// (empty when it names none or cannot be read).
    async fn image_defaults(&self, control: &Control, id: &str) -> (String, String) {
        let Ok(row) = control.records().get(id).await else {
            return Default::default();
        };
        if let Some(known) = lock(&self.images).get(&row.image_digest) {
            return known.clone();
        }
        let Ok(images) = control
            .images()
            .list(&warren_core::tenant::Principal::Operator)
            .await
        else {
            return Default::default();
        };
        let mut known = lock(&self.images);
        if known.len() >= REMEMBERED {
            known.clear();
        }
        for image in images {
            let field = |k: &str| {
                image.record["config"][k]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            };
            known.insert(image.digest.clone(), (field("user"), field("working_dir")));
        }
        known.get(&row.image_digest).cloned().unwrap_or_default()
    }
}

/// A small file of the sandbox (up to 1 MiB; empty when it cannot be read).
async fn read_small(control: &Control, id: &str, path: &str) -> String {
    let Ok(read) = control.io().read_file(id, path).await else {
        return String::new();
    };
    let mut text = Vec::new();
    let mut body = read.body;
    while let Some(Ok(chunk)) = body.next().await {
        text.extend_from_slice(&chunk);
        if text.len() > 1 << 20 {
            break;
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_name_owners_and_pick_e2bs_user() {
        let a = Accounts::parse(
            "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\nbad line\n",
            "root:x:0:\nuser:x:1000:\nstaff:x:50:\n",
        );
        assert_eq!(a.default_user.as_deref(), Some("user"));
        assert_eq!(
            (a.user_name(1000), a.group_name(50)),
            ("user".into(), "staff".into())
        );
        assert_eq!(
            (a.user_name(7), a.user_name(0)),
            ("7".into(), "root".into())
        );
        let bare = Accounts::parse("", "");
        assert_eq!(bare.default_user, None);
        assert_eq!(bare.user_name(0), "root");
        // A template's USER and WORKDIR (its image config) come first.
        let passwd = "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\napp:x:1001:1001::/app:/bin/sh\n";
        let t = Accounts::parse(passwd, "").with_image("1001:1001", "/srv");
        assert_eq!(
            (t.default_user.as_deref(), t.workdir.as_deref()),
            (Some("app"), Some("/srv"))
        );
        let t = Accounts::parse(passwd, "").with_image("root", "");
        assert_eq!((t.default_user, t.workdir), (None, None));
        let t = Accounts::parse(passwd, "").with_image("", "relative");
        assert_eq!((t.default_user.as_deref(), t.workdir), (Some("user"), None));
    }
}
