//! `/proc`, read through a descriptor init opens once at its start: in
//! gVisor a path lookup from the root goes through the gofer, which can be
//! out of descriptors (the sandbox holding files open up to its limit),
//! while `/proc` itself is the sentry's own and still answers. Init must
//! find an exec's processes to kill them even then.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use rustix::fs::{Mode, OFlags};

static PROC: OnceLock<OwnedFd> = OnceLock::new();

/// Opens `/proc` for the rest of init's life; call once at its start.
pub(crate) fn open() {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if let Ok(fd) = rustix::fs::open("/proc", flags, Mode::empty()) {
        let _ = PROC.set(fd);
    }
}

fn proc_dir() -> Option<BorrowedFd<'static>> {
    PROC.get().map(|fd| fd.as_fd())
}

/// Reads `<pid>/<name>` under `/proc`, through init's descriptor when it
/// has one.
fn read_file(pid: &str, name: &str) -> Option<String> {
    let path = format!("{pid}/{name}");
    let Some(dir) = proc_dir() else {
        return std::fs::read_to_string(format!("/proc/{path}")).ok();
    };
    let flags = OFlags::RDONLY | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, path.as_str(), flags, Mode::empty()).ok()?;
    std::io::read_to_string(std::fs::File::from(fd)).ok()
}

/// The pids `/proc` lists.
pub(crate) fn pids() -> Vec<i32> {
    let listed = proc_dir().and_then(|dir| {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, ".", flags, Mode::empty()).ok()?;
        let entries = rustix::fs::Dir::read_from(&fd).ok()?;
        Some(
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().ok()?.parse().ok())
                .collect::<Vec<i32>>(),
        )
    });
    match listed {
        Some(pids) => pids,
        None => std::fs::read_dir("/proc")
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default(),
    }
}

pub(crate) struct Stat(Vec<String>);

/// Reads `/proc/<pid>/stat` (`pid` may be `self`).
pub(crate) fn read(pid: &str) -> Option<Stat> {
    let text = read_file(pid, "stat")?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields that follow it start after its last ')'.
    let (_, rest) = text.rsplit_once(") ")?;
    Some(Stat(rest.split_whitespace().map(str::to_string).collect()))
}

impl Stat {
    /// Field `n` (1-based, as in proc(5)); fields 1 and 2 are not kept.
    pub(crate) fn field(&self, n: usize) -> Option<&str> {
        self.0.get(n.checked_sub(3)?).map(String::as_str)
    }
}
