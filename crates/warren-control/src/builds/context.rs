//! A build's context: the tar archive the client sent, spooled to a file
//! and indexed, never unpacked on the host (its names and links cannot
//! reach anything outside it). `.dockerignore` is applied here, for every
//! door alike. `COPY` sources are chosen from the index, hashed for the
//! step cache, and written out as the tar a sandbox unpacks.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Component, Path};

use globset::{GlobBuilder, GlobMatcher};
use sha2::{Digest as _, Sha256};

/// The largest context a build takes.
pub(crate) const MAX_CONTEXT: u64 = 4 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub kind: Kind,
    pub mode: u32,
    pub size: u64,
    /// Where the file's bytes start in the spooled archive.
    offset: u64,
    pub link: Option<String>,
    /// sha256 of a file's bytes.
    pub digest: String,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ContextError {
    #[error("the build context is not a tar archive: {0}")]
    NotTar(io::Error),
    #[error("the build context entry {0:?} {1}")]
    BadEntry(String, &'static str),
    #[error("the build context is larger than {} GiB", MAX_CONTEXT >> 30)]
    TooLarge,
    #[error("{0} is not in the build context (mind .dockerignore)")]
    Missing(String),
    #[error("source {0:?} leaves the build context")]
    Outside(String),
    #[error("pattern {0:?}: {1}")]
    Pattern(String, globset::Error),
    #[error("reading the build context: {0}")]
    Io(#[from] io::Error),
}

pub(crate) struct Context {
    file: File,
    entries: BTreeMap<String, Entry>,
}

impl Context {
    /// Indexes a spooled archive and reads the Dockerfile at `dockerfile`
    /// from it; `.dockerignore` (if the archive holds one) then removes
    /// what it names, as `docker build` does.
    pub(crate) fn index(
        mut file: File,
        dockerfile: &str,
    ) -> Result<(Context, Option<String>), ContextError> {
        if file.metadata()?.len() > MAX_CONTEXT {
            return Err(ContextError::TooLarge);
        }
        file.seek(SeekFrom::Start(0))?;
        let mut entries = BTreeMap::new();
        let mut archive = tar::Archive::new(&mut file);
        for entry in archive.entries().map_err(ContextError::NotTar)? {
            let mut entry = entry.map_err(ContextError::NotTar)?;
            let raw = entry.path().map_err(ContextError::NotTar)?.into_owned();
            let Some(path) = clean(&raw) else {
                return Err(ContextError::BadEntry(
                    raw.display().to_string(),
                    "leaves the context ('..' or an absolute name)",
                ));
            };
            if path.is_empty() {
                continue;
            }
            let header = entry.header();
            let mode = header.mode().unwrap_or(0o644) & 0o7777;
            let (kind, link) = match header.entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => (Kind::File, None),
                tar::EntryType::Directory => (Kind::Dir, None),
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(ContextError::NotTar)?
                        .map(|t| t.display().to_string())
                        .unwrap_or_default();
                    (Kind::Symlink, Some(target))
                }
                _ => {
                    return Err(ContextError::BadEntry(
                        path,
                        "is not a file, directory or symlink (hard links, devices and fifos are not sent)",
                    ))
                }
            };
            let offset = entry.raw_file_position();
            let size = entry.size();
            let mut hasher = Sha256::new();
            if kind == Kind::File {
                io::copy(&mut entry, &mut HashWriter(&mut hasher))?;
            }
            entries.insert(
                path,
                Entry {
                    kind,
                    mode,
                    size,
                    offset,
                    link,
                    digest: hex::encode(hasher.finalize()),
                },
            );
        }
        let mut context = Context { file, entries };
        let dockerfile = context.read_text(dockerfile)?;
        if let Some(text) = context.read_text(".dockerignore")? {
            let ignore = Ignore::parse(&text)?;
            context.entries.retain(|path, _| !ignore.excludes(path));
        }
        Ok((context, dockerfile))
    }

    /// A small file of the context as text (the Dockerfile, .dockerignore).
    fn read_text(&mut self, path: &str) -> Result<Option<String>, ContextError> {
        let Some(entry) = self.entries.get(path).filter(|e| e.kind == Kind::File) else {
            return Ok(None);
        };
        let mut bytes = vec![0; entry.size.min(16 << 20) as usize];
        self.file.seek(SeekFrom::Start(entry.offset))?;
        self.file.read_exact(&mut bytes)?;
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// What a `COPY` source names: `(path in the context, path below the
    /// destination)` for every entry it copies, and whether the source was
    /// one file (which may be renamed by the destination).
    pub(crate) fn select(&self, source: &str) -> Result<Selection, ContextError> {
        let Some(cleaned) = clean(Path::new(source.trim_start_matches('/'))) else {
            return Err(ContextError::Outside(source.to_string()));
        };
        let roots: Vec<&String> = if cleaned.contains(['*', '?', '[']) {
            let glob = glob(&cleaned)?;
            self.entries.keys().filter(|p| glob.is_match(p)).collect()
        } else if cleaned.is_empty() {
            Vec::new()
        } else if let Some((path, _)) = self.entries.get_key_value(&cleaned) {
            vec![path]
        } else if self.entries.keys().any(|p| is_below(p, &cleaned)) {
            // A directory the archive has no entry of its own for.
            return Ok(self.below(&cleaned));
        } else {
            return Err(ContextError::Missing(source.to_string()));
        };
        if cleaned.is_empty() {
            return Ok(self.below(""));
        }
        if roots.is_empty() {
            return Err(ContextError::Missing(source.to_string()));
        }
        let single_file = roots.len() == 1 && self.entries[roots[0]].kind != Kind::Dir;
        let mut all = Selection {
            items: Vec::new(),
            single_file,
        };
        for root in roots {
            if self.entries[root].kind == Kind::Dir {
                all.items.extend(self.below(root).items);
            } else {
                let name = root.rsplit('/').next().unwrap_or(root);
                all.items.push((root.clone(), name.to_string()));
            }
        }
        Ok(all)
    }

    /// Everything below `dir` (its contents, not itself).
    fn below(&self, dir: &str) -> Selection {
        let items = self
            .entries
            .keys()
            .filter(|p| dir.is_empty() || is_below(p, dir))
            .map(|p| {
                let rel = if dir.is_empty() {
                    p.as_str()
                } else {
                    &p[dir.len() + 1..]
                };
                (p.clone(), rel.to_string())
            })
            .collect();
        Selection {
            items,
            single_file: false,
        }
    }

    /// A digest of what a selection copies (names, kinds, modes, bytes,
    /// link targets): the step cache's key part for a `COPY`.
    pub(crate) fn digest(&self, sel: &Selection) -> String {
        let mut h = Sha256::new();
        for (path, rel) in &sel.items {
            let e = &self.entries[path];
            h.update(format!(
                "{rel}\0{:?}\0{:o}\0{}\0{:?}\n",
                e.kind, e.mode, e.digest, e.link
            ));
        }
        hex::encode(h.finalize())
    }

    /// Writes a tar of the selection (names below the destination, owner
    /// root, `chmod` if given) to `out`.
    pub(crate) fn write_tar(
        &mut self,
        sel: &Selection,
        rename: Option<&str>,
        chmod: Option<u32>,
        out: impl Write,
    ) -> Result<(), ContextError> {
        let mut tar = tar::Builder::new(out);
        for (path, rel) in &sel.items {
            let e = self.entries[path].clone();
            let name = rename.unwrap_or(rel);
            let mut h = tar::Header::new_gnu();
            h.set_mode(chmod.unwrap_or(e.mode));
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            match e.kind {
                Kind::Dir => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    tar.append_data(&mut h, name, io::empty())?;
                }
                Kind::Symlink => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    tar.append_link(&mut h, name, e.link.as_deref().unwrap_or_default())?;
                }
                Kind::File => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(e.size);
                    self.file.seek(SeekFrom::Start(e.offset))?;
                    tar.append_data(&mut h, name, (&mut self.file).take(e.size))?;
                }
            }
        }
        tar.into_inner()?.flush()?;
        Ok(())
    }

    /// The bytes of one file (ADD of a local archive).
    pub(crate) fn open(&mut self, path: &str) -> Result<impl Read + '_, ContextError> {
        let e = self.entries[path].clone();
        self.file.seek(SeekFrom::Start(e.offset))?;
        Ok((&mut self.file).take(e.size))
    }
}

/// What one `COPY` source copies.
#[derive(Clone)]
pub(crate) struct Selection {
    /// (path in the context, path below the destination), sorted.
    pub items: Vec<(String, String)>,
    pub single_file: bool,
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn is_below(path: &str, dir: &str) -> bool {
    path.len() > dir.len() + 1 && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

/// A relative path without `.`, empty parts or a trailing slash; None if
/// it is absolute or climbs out with `..`.
fn clean(path: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.join("/"))
}

/// A path pattern as Docker's (Go's `filepath.Match`, plus `**`): `*`
/// stays within one path component.
fn glob(pattern: &str) -> Result<GlobMatcher, ContextError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| ContextError::Pattern(pattern.to_string(), e))
}

/// `.dockerignore`: patterns, `!` exceptions, the last match wins; a
/// pattern that names a directory excludes what it holds.
struct Ignore(Vec<(GlobMatcher, bool)>);

impl Ignore {
    fn parse(text: &str) -> Result<Ignore, ContextError> {
        let mut rules = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (exclude, pattern) = match line.strip_prefix('!') {
                Some(p) => (false, p.trim()),
                None => (true, line),
            };
            let Some(cleaned) = clean(Path::new(pattern.trim_start_matches('/'))) else {
                continue;
            };
            if cleaned.is_empty() {
                continue;
            }
            rules.push((glob(&cleaned)?, exclude));
        }
        Ok(Ignore(rules))
    }

    fn excludes(&self, path: &str) -> bool {
        let mut excluded = false;
        for (glob, exclude) in &self.0 {
            let hit = glob.is_match(path)
                || path
                    .match_indices('/')
                    .any(|(at, _)| glob.is_match(&path[..at]));
            if hit {
                excluded = *exclude;
            }
        }
        excluded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(files: &[(&str, &str)]) -> Context {
        indexed(files).0
    }

    fn indexed(files: &[(&str, &str)]) -> (Context, Option<String>) {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, body) in files {
            let mut h = tar::Header::new_gnu();
            if name.ends_with('/') {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                tar.append_data(&mut h, name, io::empty()).unwrap();
            } else {
                h.set_mode(0o644);
                h.set_size(body.len() as u64);
                tar.append_data(&mut h, name, body.as_bytes()).unwrap();
            }
        }
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&tar.into_inner().unwrap()).unwrap();
        Context::index(file, "Dockerfile").unwrap()
    }

    fn rels(sel: &Selection) -> Vec<&str> {
        sel.items.iter().map(|(_, r)| r.as_str()).collect()
    }

    #[test]
    fn sources_like_docker() {
        let c = context(&[
            ("./app/", ""),
            ("./app/main.py", "print(1)"),
            ("./app/lib/x.py", "x"),
            ("./req.txt", "flask"),
            ("./a.py", "a"),
        ]);
        assert_eq!(rels(&c.select("app").unwrap()), ["lib/x.py", "main.py"]);
        let one = c.select("./req.txt").unwrap();
        assert!(one.single_file);
        assert_eq!(rels(&one), ["req.txt"]);
        assert_eq!(rels(&c.select("*.py").unwrap()), ["a.py"]);
        assert_eq!(rels(&c.select("app/lib").unwrap()), ["x.py"]);
        assert!(c.select(".").unwrap().items.len() == 5);
        assert!(matches!(c.select("nope"), Err(ContextError::Missing(_))));
        assert!(matches!(
            c.select("../etc/passwd"),
            Err(ContextError::Outside(_))
        ));
        // A content change changes the digest; the same content does not.
        let again = context(&[("./req.txt", "flask")]);
        let other = context(&[("./req.txt", "flask2")]);
        let d = |c: &Context| c.digest(&c.select("req.txt").unwrap());
        assert_eq!(d(&c), d(&again));
        assert_ne!(d(&c), d(&other));
    }

    #[test]
    fn dockerignore_excludes_with_exceptions() {
        let (mut c, dockerfile) = indexed(&[
            ("Dockerfile", "FROM x"),
            (
                ".dockerignore",
                "Dockerfile\n# comment\n.git\n*.log\n!keep.log\nbuild/**\n",
            ),
            (".git/config", "x"),
            ("a.log", ""),
            ("keep.log", ""),
            ("build/out/x", ""),
            ("src/a.log", ""),
            ("src/main.rs", ""),
        ]);
        let all: Vec<&str> = c.entries.keys().map(String::as_str).collect();
        assert_eq!(
            all,
            [".dockerignore", "keep.log", "src/a.log", "src/main.rs"]
        );
        // Read before .dockerignore applies, as docker build does.
        assert_eq!(dockerfile.as_deref(), Some("FROM x"));
        let mut out = Vec::new();
        let sel = c.select("src").unwrap();
        c.write_tar(&sel, None, Some(0o600), &mut out).unwrap();
        let mut archive = tar::Archive::new(&out[..]);
        let names: Vec<(String, u32)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().mode().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [("a.log".to_string(), 0o600), ("main.rs".to_string(), 0o600)]
        );
    }

    #[test]
    fn archives_that_climb_out_are_refused() {
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        // `append_data` refuses '..'; write the name by hand.
        h.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
        h.set_cksum();
        tar.append(&h, &b"x"[..]).unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&tar.into_inner().unwrap()).unwrap();
        assert!(matches!(
            Context::index(file, "Dockerfile"),
            Err(ContextError::BadEntry(_, _))
        ));
    }
}
