//! Watching a directory inside a sandbox from the host with inotify. The
//! directory is resolved like every other sandbox path (`openat2` with
//! `RESOLVE_IN_ROOT`, so nothing outside the sandbox's root is reached),
//! and the watch is added on the descriptor (`/proc/self/fd/N`), never on
//! a host path. A recursive watch adds its subdirectories, and new ones as
//! they appear, up to [`MAX_WATCHES`].

use std::collections::{HashMap, VecDeque};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::OFlags;

use crate::files::open_in;
use crate::RuntimeError;

/// The most directories one recursive watch covers.
pub const MAX_WATCHES: usize = 4096;

/// The names the file API writes through (see `files::write_file`).
const UPLOAD_PREFIX: &str = ".warren-upload-";

/// What happened to an entry, as Go's fsnotify (and so E2B's envd) names
/// inotify's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// An open watch of one directory (and its subdirectories).
pub struct Watch {
    inotify: OwnedFd,
    root: OwnedFd,
    /// The watched directory, as the sandbox names it.
    base: String,
    recursive: bool,
    /// Each watch's directory, relative to `base` ("" for `base`).
    dirs: HashMap<i32, String>,
    top: i32,
    buf: Vec<MaybeUninit<u8>>,
    /// Cookies of file-API uploads renamed away from their temporary name.
    uploads: VecDeque<u32>,
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::ONLYDIR);

impl Watch {
    /// Starts watching `path` in the sandbox whose root is `root`:
    /// NotFound when it is missing, BadPath when it is not a directory.
    pub fn new(root: OwnedFd, path: &str, recursive: bool) -> Result<Watch, RuntimeError> {
        let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| RuntimeError::os("inotify", e))?;
        let mut w = Watch {
            inotify,
            root,
            base: path.trim_end_matches('/').to_string(),
            recursive,
            dirs: HashMap::new(),
            top: -1,
            buf: vec![MaybeUninit::uninit(); 64 * 1024],
            uploads: VecDeque::new(),
        };
        w.top = w.add("")?;
        if recursive {
            w.add_tree("", None)?;
        }
        Ok(w)
    }

    fn sandbox_path(&self, rel: &str) -> String {
        let dir = if self.base.is_empty() {
            "/"
        } else {
            &self.base
        };
        if rel.is_empty() {
            dir.to_string()
        } else {
            format!("{}/{rel}", dir.trim_end_matches('/'))
        }
    }

    /// Watches the directory `rel`; its watch descriptor.
    fn add(&mut self, rel: &str) -> Result<i32, RuntimeError> {
        if self.dirs.len() >= MAX_WATCHES {
            return Err(RuntimeError::BadPath(format!(
                "{}: more than {MAX_WATCHES} directories to watch; watch a smaller tree or not recursively",
                self.sandbox_path("")
            )));
        }
        let path = self.sandbox_path(rel);
        let dir = open_in(&self.root, &path, OFlags::PATH | OFlags::DIRECTORY, 0)?;
        let proc = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let wd = inotify::add_watch(&self.inotify, proc.as_str(), MASK).map_err(|e| match e {
            rustix::io::Errno::NOSPC => {
                RuntimeError::Files(format!("{path}: the host's inotify watch limit is reached"))
            }
            e => RuntimeError::os(format!("{path}: watch"), e),
        })?;
        self.dirs.insert(wd, rel.to_string());
        Ok(wd)
    }

    /// Watches every directory below `rel` (already watched itself). With
    /// `found`, every entry met is reported there as created (and a file as
    /// written too): in a directory that appeared while watched, what was
    /// made before its own watch was in place has no event of its own.
    fn add_tree(
        &mut self,
        rel: &str,
        mut found: Option<&mut Vec<(String, Change)>>,
    ) -> Result<(), RuntimeError> {
        let mut todo = vec![rel.to_string()];
        while let Some(dir) = todo.pop() {
            let path = self.sandbox_path(&dir);
            // The sandbox may change the tree as we walk: what went is skipped.
            let Ok(fd) = open_in(&self.root, &path, OFlags::RDONLY | OFlags::DIRECTORY, 0) else {
                continue;
            };
            let Ok(entries) = rustix::fs::Dir::read_from(&fd) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let Ok(name) = std::str::from_utf8(name) else {
                    continue;
                };
                let sub = join(&dir, name);
                // An upload's temporary name is never shown (see `read`).
                if let Some(found) = found
                    .as_deref_mut()
                    .filter(|_| !name.starts_with(UPLOAD_PREFIX))
                {
                    found.push((sub.clone(), Change::Create));
                    if entry.file_type() == rustix::fs::FileType::RegularFile {
                        found.push((sub.clone(), Change::Write));
                    }
                }
                if entry.file_type() != rustix::fs::FileType::Directory {
                    continue;
                }
                match self.add(&sub) {
                    Ok(_) => todo.push(sub),
                    Err(RuntimeError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Drops the watches of `rel` and below (moved away or removed).
    fn forget(&mut self, rel: &str) {
        let prefix = format!("{rel}/");
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(wd, d)| **wd != self.top && (*d == rel || d.starts_with(&prefix)))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = inotify::remove_watch(&self.inotify, wd);
        }
    }

    /// The events ready now (none if none), without waiting; after the
    /// watched directory itself is gone (removed, or its filesystem
    /// unmounted with the sandbox) `is_over` says so.
    pub fn read(&mut self) -> Result<Vec<(String, Change)>, RuntimeError> {
        let mut raw = Vec::new();
        {
            let mut reader = inotify::Reader::new(&self.inotify, &mut self.buf);
            loop {
                match reader.next() {
                    Ok(ev) => raw.push((
                        ev.wd(),
                        ev.events(),
                        ev.cookie(),
                        ev.file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                    )),
                    Err(rustix::io::Errno::AGAIN) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(RuntimeError::os("inotify read", e)),
                }
                if reader.is_buffer_empty() {
                    break;
                }
            }
        }
        let mut out = Vec::new();
        // A write through the file API is a temporary file renamed into
        // place: it is reported as envd reports a write, a create and a
        // write of the file's own name.
        for (wd, flags, cookie, name) in raw {
            if flags.contains(ReadFlags::IGNORED) || flags.contains(ReadFlags::DELETE_SELF) {
                if wd == self.top || flags.contains(ReadFlags::IGNORED) {
                    self.dirs.remove(&wd);
                }
                continue;
            }
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                continue;
            }
            let Some(dir) = self.dirs.get(&wd).cloned() else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            if name.starts_with(UPLOAD_PREFIX) {
                if flags.contains(ReadFlags::MOVED_FROM) {
                    if self.uploads.len() >= 64 {
                        self.uploads.pop_front();
                    }
                    self.uploads.push_back(cookie);
                }
                continue;
            }
            let rel = join(&dir, &name);
            if flags.contains(ReadFlags::MOVED_TO) && self.uploads.contains(&cookie) {
                self.uploads.retain(|c| *c != cookie);
                out.push((rel.clone(), Change::Create));
                out.push((rel, Change::Write));
                continue;
            }
            let is_dir = flags.contains(ReadFlags::ISDIR);
            let change = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                if is_dir && self.recursive {
                    out.push((rel.clone(), Change::Create));
                    match self.add(&rel) {
                        Ok(_) => self.add_tree(&rel, Some(&mut out))?,
                        Err(RuntimeError::NotFound(_)) => {}
                        Err(e) => return Err(e),
                    }
                    continue;
                }
                Change::Create
            } else if flags.contains(ReadFlags::MODIFY) {
                Change::Write
            } else if flags.contains(ReadFlags::DELETE) {
                if is_dir {
                    self.forget(&rel);
                }
                Change::Remove
            } else if flags.contains(ReadFlags::MOVED_FROM) {
                if is_dir {
                    self.forget(&rel);
                }
                Change::Rename
            } else if flags.contains(ReadFlags::ATTRIB) {
                Change::Chmod
            } else {
                continue;
            };
            out.push((rel, change));
        }
        Ok(out)
    }

    /// Whether the watched directory is gone (once a `read` saw it go).
    pub fn is_over(&self) -> bool {
        !self.dirs.contains_key(&self.top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes(w: &mut Watch) -> Vec<(String, Change)> {
        let mut all = Vec::new();
        for _ in 0..20 {
            all.extend(w.read().expect("read"));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        all
    }

    #[test]
    fn a_recursive_watch_reports_changes_by_relative_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("w")).expect("mkdir");
        let root = || {
            rustix::fs::open(
                dir.path(),
                OFlags::PATH | OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .expect("root")
        };
        let missing = Watch::new(root(), "/nope", false).err().expect("missing");
        assert!(matches!(missing, RuntimeError::NotFound(_)), "{missing:?}");
        std::fs::write(dir.path().join("file"), "x").expect("write");
        let file = Watch::new(root(), "/file", false).err().expect("a file");
        assert!(matches!(file, RuntimeError::BadPath(_)), "{file:?}");

        let mut w = Watch::new(root(), "/w", true).expect("watch");
        let base = dir.path().join("w");
        std::fs::write(base.join("a"), "1").expect("write");
        std::fs::create_dir(base.join("sub")).expect("mkdir");
        // The new directory is watched once its create is read.
        let first = changes(&mut w);
        assert!(first.contains(&("a".into(), Change::Create)), "{first:?}");
        assert!(first.contains(&("a".into(), Change::Write)), "{first:?}");
        assert!(first.contains(&("sub".into(), Change::Create)), "{first:?}");
        std::fs::write(base.join("sub/c"), "2").expect("write");
        // A directory made with files in it before its watch is in place:
        // what is already there is reported as made.
        std::fs::create_dir_all(base.join("fast/deeper")).expect("mkdir");
        std::fs::write(base.join("fast/deeper/f"), "4").expect("write");
        std::fs::rename(base.join("a"), base.join("b")).expect("rename");
        std::fs::remove_file(base.join("b")).expect("rm");
        // A file-API upload shows as a create and a write of its name.
        std::fs::write(base.join(".warren-upload-0123"), "3").expect("write");
        std::fs::rename(base.join(".warren-upload-0123"), base.join("up")).expect("rename");
        let next = changes(&mut w);
        let want = [
            ("sub/c", Change::Create),
            ("fast", Change::Create),
            ("fast/deeper", Change::Create),
            ("fast/deeper/f", Change::Create),
            ("fast/deeper/f", Change::Write),
            ("a", Change::Rename),
            ("b", Change::Create),
            ("b", Change::Remove),
            ("up", Change::Create),
            ("up", Change::Write),
        ];
        for (name, change) in want {
            assert!(
                next.contains(&(name.into(), change)),
                "{name} {change:?} in {next:?}"
            );
        }
        assert!(
            next.iter().all(|(n, _)| !n.contains(".warren-upload")),
            "{next:?}"
        );
        assert!(!w.is_over());
        std::fs::remove_dir_all(&base).expect("rm -r");
        changes(&mut w);
        assert!(w.is_over());
    }
}
