//! Users and paths as envd reads them: the user from `Authorization:
//! Basic base64("<user>:")` (or `username=` on /files), and paths that are
//! relative or start with `~` resolved against that user's home.

use axum::http::HeaderMap;
use base64::Engine;

/// The user a call names, if any (None: the sandbox's default user).
pub fn user(headers: &HeaderMap) -> Option<String> {
    let basic = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(basic.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let name = text.split(':').next().unwrap_or("").trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// The home directory envd gives a user.
pub fn home(user: Option<&str>) -> String {
    match user {
        None | Some("root") => "/root".into(),
        Some(u) => format!("/home/{u}"),
    }
}

/// An absolute path for `path` as the user sees it.
pub fn resolve(path: &str, user: Option<&str>) -> String {
    let home = home(user);
    if path.is_empty() || path == "~" {
        home
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_tilde_paths_are_under_home() {
        assert_eq!(resolve("a.txt", None), "/root/a.txt");
        assert_eq!(resolve("~/x/y", Some("user")), "/home/user/x/y");
        assert_eq!(resolve("/etc/hosts", Some("user")), "/etc/hosts");
        assert_eq!(resolve("", None), "/root");
    }

    #[test]
    fn the_user_comes_from_basic_auth() {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::AUTHORIZATION,
            "Basic dXNlcjo=".parse().expect("header"),
        );
        assert_eq!(user(&h).as_deref(), Some("user"));
        assert_eq!(user(&HeaderMap::new()), None);
    }
}
