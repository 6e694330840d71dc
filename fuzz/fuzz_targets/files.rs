//! The file API's path handling (`warren_runtime::files`), driven by a small
//! script against a sandbox root full of hostile symlinks (to `/`, up out of
//! the root, to a host directory, to magic links in /proc). One op a line:
//!
//! ```text
//! read PATH            open_read (and pack_dir for a directory)
//! mkdir PATH           mkdir_all
//! write PATH DATA      write_file
//! plant NAME TARGET    the sandbox plants a symlink NAME (one component) in its root
//! dir NAME             the sandbox makes a directory NAME in its root
//! fifo NAME            the sandbox makes a fifo NAME in its root
//! untar PATH           unpack_tar of the tar script lines that follow, up to `end`
//! ```
//!
//! Whatever the script does, the host tree beside the root stays unchanged,
//! nothing appears next to the root, and every descriptor handed back lies
//! inside the root.
#![no_main]

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use warren_fuzz::{assert_nothing_beside, entries, outside, snapshot, tar_from_script};
use warren_runtime::files::{self, Entry};

const BASE: &str = "/tmp/warren-fuzz-files";

struct Fixture {
    outside: PathBuf,
    before: BTreeMap<PathBuf, String>,
    work: PathBuf,
    root: PathBuf,
    inodes: Vec<(u64, u64)>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let base = PathBuf::from(BASE);
        let outside = outside(&base).expect("creating the outside tree");
        let before = snapshot(&outside);
        let work = base.join(format!("work-{}", std::process::id()));
        let root = work.join("root");
        let mut inodes: Vec<(u64, u64)> = entries(&outside)
            .iter()
            .map(|(_, m)| (m.dev(), m.ino()))
            .collect();
        let top = fs::metadata(&outside).expect("stat of the outside tree");
        inodes.push((top.dev(), top.ino()));
        for host in [BASE, "/", "/tmp"] {
            let m = fs::metadata(host).expect("stat of a host directory");
            inodes.push((m.dev(), m.ino()));
        }
        Fixture {
            outside,
            before,
            work,
            root,
            inodes,
        }
    })
}

fn make_root(root: &Path) -> OwnedFd {
    fs::create_dir_all(root.join("tmp/d")).expect("creating the root");
    fs::write(root.join("tmp/f"), b"inside").expect("writing a file in the root");
    for (name, target) in [
        ("abs", "/"),
        ("up", "../../../../../.."),
        ("host", "/tmp/warren-fuzz-files/outside"),
        ("out", "../../outside"),
        ("secret", "/tmp/warren-fuzz-files/outside/secret"),
        ("self", "/proc/self/root"),
        ("cwd", "/proc/1/cwd"),
        ("tmp/loop", "loop"),
    ] {
        std::os::unix::fs::symlink(target, root.join(name)).expect("planting a symlink");
    }
    OwnedFd::from(fs::File::open(root).expect("opening the root"))
}

/// Where a descriptor we were handed points on the host.
fn fd_path(fd: &impl AsRawFd) -> PathBuf {
    fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("readlink of our own fd")
}

/// The path check alone could be fooled by a name that merely looks
/// inside, so the inode must also not be one of the host tree's.
fn assert_inside(f: &Fixture, fd: &(impl AsRawFd + AsFd), op: &str) {
    let p = fd_path(fd);
    assert!(
        p.starts_with(&f.root),
        "{op} handed back {p:?}, outside the root"
    );
    let st = rustix::fs::fstat(fd).expect("fstat of our own fd");
    assert!(
        !f.inodes.contains(&(st.st_dev, st.st_ino)),
        "{op} handed back a host inode ({p:?})"
    );
}

fn name_ok(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let _ = fs::remove_dir_all(&f.work);
    let root = make_root(&f.root);
    let mut lines = data.split(|b| *b == b'\n');
    while let Some(line) = lines.next() {
        let mut fields = line.splitn(3, |b| *b == b' ');
        let (Some(op), Some(arg)) = (fields.next(), fields.next()) else {
            continue;
        };
        let rest = fields.next().unwrap_or_default();
        let Ok(path) = std::str::from_utf8(arg) else {
            continue;
        };
        let what = format!("{} {path:?}", String::from_utf8_lossy(op));
        match op {
            b"read" => match files::open_read(&root, path) {
                Ok(Entry::File(mut file, _)) => {
                    assert_inside(f, &file, &what);
                    let mut buf = Vec::new();
                    let _ = (&mut file).take(1 << 20).read_to_end(&mut buf);
                }
                Ok(Entry::Dir(dir)) => {
                    assert_inside(f, &dir, &what);
                    let _ = files::pack_dir(dir, &mut std::io::sink());
                }
                Err(_) => {}
            },
            b"mkdir" => {
                if let Ok(dir) = files::mkdir_all(&root, path) {
                    assert_inside(f, &dir, &what);
                }
            }
            b"write" => {
                let _ = files::write_file(&root, path, 0o644, &Default::default(), &mut &rest[..]);
            }
            b"plant" if name_ok(arg) && !rest.is_empty() && !rest.contains(&0) => {
                let _ = rustix::fs::symlinkat(rest, &root, arg);
            }
            b"fifo" if name_ok(arg) => {
                let _ = rustix::fs::mknodat(
                    &root,
                    arg,
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from(0o666),
                    0,
                );
            }
            b"dir" if name_ok(arg) => {
                let _ = rustix::fs::mkdirat(&root, arg, rustix::fs::Mode::from(0o755));
            }
            b"untar" => {
                let mut script = Vec::new();
                for l in lines.by_ref() {
                    if l == b"end" {
                        break;
                    }
                    script.extend_from_slice(l);
                    script.push(b'\n');
                }
                let tar = tar_from_script(&script);
                let _ = files::unpack_tar(&root, path, &mut &tar[..]);
            }
            _ => continue,
        }
        assert_eq!(
            snapshot(&f.outside),
            f.before,
            "{what} changed the host tree"
        );
        assert_nothing_beside(Path::new(BASE), &f.work, "root", &what);
    }
});
