//! Helpers shared by the fuzz targets: a tiny line language that builds tar
//! archives with hostile names (the `tar` crate's builder refuses them), and
//! a snapshot of a directory tree to prove a run left it alone.
//!
//! Tar script, one entry per line (`NAME`, `TARGET` and `DATA` are taken
//! verbatim, up to the next space; `DATA` runs to the end of the line):
//!
//! ```text
//! f NAME DATA      regular file
//! d NAME           directory
//! s NAME TARGET    symlink
//! h NAME TARGET    hard link
//! c NAME           character device 1:3
//! p NAME           fifo
//! x KEY VALUE      PAX record for the next entry (e.g. SCHILY.xattr.user.a v)
//! m MODE           octal mode for the next entry
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

fn block_pad(out: &mut Vec<u8>) {
    let rem = out.len() % 512;
    if rem != 0 {
        out.resize(out.len() + 512 - rem, 0);
    }
}

/// A GNU long name (`L`) or long link (`K`) pseudo-entry, for names that do
/// not fit the header's 100 bytes.
fn gnu_long(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_size(value.len() as u64 + 1);
    h.set_mode(0o644);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(value);
    out.push(0);
    block_pad(out);
}

fn put_name(field: &mut [u8; 100], value: &[u8]) {
    let n = value.len().min(100);
    field[..n].copy_from_slice(&value[..n]);
}

/// Appends one entry with raw, unchecked name and link target.
pub fn raw_entry(out: &mut Vec<u8>, kind: u8, name: &[u8], link: &[u8], data: &[u8], mode: u32) {
    if name.len() > 100 {
        gnu_long(out, b'L', name);
    }
    if link.len() > 100 {
        gnu_long(out, b'K', link);
    }
    let mut h = tar::Header::new_gnu();
    put_name(&mut h.as_old_mut().name, name);
    put_name(&mut h.as_old_mut().linkname, link);
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    if kind == b'3' {
        h.set_device_major(1).ok();
        h.set_device_minor(3).ok();
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    block_pad(out);
}

/// Builds a tar archive from the script in the module docs. Unknown lines
/// are skipped, so every input makes some archive.
pub fn tar_from_script(script: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut pax: Vec<u8> = Vec::new();
    let mut mode = None;
    for line in script.split(|b| *b == b'\n') {
        let mut fields = line.splitn(3, |b| *b == b' ');
        let (Some(op), Some(name)) = (fields.next(), fields.next()) else {
            continue;
        };
        let rest = fields.next().unwrap_or_default();
        let kind = match op {
            b"f" => b'0',
            b"d" => b'5',
            b"s" => b'2',
            b"h" => b'1',
            b"c" => b'3',
            b"p" => b'6',
            b"x" => {
                // "len key=value\n", where len counts the whole record.
                let body_len = name.len() + rest.len() + 3;
                let mut len = body_len + 1;
                while len != body_len + len.to_string().len() {
                    len = body_len + len.to_string().len();
                }
                pax.extend_from_slice(format!("{len} ").as_bytes());
                pax.extend_from_slice(name);
                pax.push(b'=');
                pax.extend_from_slice(rest);
                pax.push(b'\n');
                continue;
            }
            b"m" => {
                mode = std::str::from_utf8(name)
                    .ok()
                    .and_then(|m| u32::from_str_radix(m, 8).ok());
                continue;
            }
            _ => continue,
        };
        if !pax.is_empty() {
            raw_entry(&mut out, b'x', b"PaxHeaders/x", b"", &pax, 0o644);
            pax.clear();
        }
        let default_mode = if kind == b'5' { 0o755 } else { 0o644 };
        let mode = mode.take().unwrap_or(default_mode);
        match kind {
            b'0' => raw_entry(&mut out, kind, name, b"", rest, mode),
            b'1' | b'2' => raw_entry(&mut out, kind, name, rest, b"", mode),
            _ => raw_entry(&mut out, kind, name, b"", b"", mode),
        }
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Everything observable about a tree without following symlinks: type,
/// mode, owner, size, link count, mtime, symlink target and file contents.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, path: &Path, out: &mut BTreeMap<PathBuf, String>) {
    let rel = path.strip_prefix(root).unwrap_or(path).to_path_buf();
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => {
            out.insert(rel, format!("error {e}"));
            return;
        }
    };
    let ft = meta.file_type();
    let extra = if ft.is_symlink() {
        format!("-> {:?}", fs::read_link(path).ok())
    } else if ft.is_file() {
        format!("{:?}", fs::read(path).ok())
    } else {
        String::new()
    };
    out.insert(
        rel,
        format!(
            "{ft:?} mode={:o} uid={} gid={} size={} nlink={} mtime={} {extra}",
            meta.mode(),
            meta.uid(),
            meta.gid(),
            meta.size(),
            meta.nlink(),
            meta.mtime(),
        ),
    );
    if ft.is_dir() {
        let mut names: Vec<PathBuf> = fs::read_dir(path)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        names.sort();
        for child in names {
            walk(root, &child, out);
        }
    }
}

/// The secret planted outside the tree under test. A run that returns or
/// changes it has escaped.
pub const SECRET: &[u8] = b"WARREN-FUZZ-OUTSIDE-SECRET";

/// Creates `base/outside` (a secret file, a directory, a file in it) once;
/// returns its path. Several fuzzing processes may share it.
pub fn outside(base: &Path) -> io::Result<PathBuf> {
    let dir = base.join("outside");
    fs::create_dir_all(dir.join("dir"))?;
    for file in [dir.join("secret"), dir.join("dir/inner")] {
        if fs::read(&file).ok().as_deref() != Some(SECRET) {
            fs::write(&file, SECRET)?;
        }
    }
    Ok(dir)
}

/// Names directly under `base` that a run must not have created: anything
/// but `outside` and the per-process work directories starting with `work`.
pub fn strays(base: &Path) -> Vec<String> {
    fs::read_dir(base)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n != "outside" && !n.starts_with("work"))
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that a run created nothing beside the tree it was given: no
/// stray under `base`, and `work` holds only `kept` (the root or layer).
pub fn assert_nothing_beside(base: &Path, work: &Path, kept: &str, what: &str) {
    assert_eq!(
        strays(base),
        Vec::<String>::new(),
        "{what} created a file beside the {kept}"
    );
    let beside: Vec<_> = fs::read_dir(work)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(
        beside,
        vec![std::ffi::OsString::from(kept)],
        "{what} created a file beside the {kept}"
    );
}

/// Lists the tree under `dir` (not following symlinks), type and all.
pub fn entries(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(list) = fs::read_dir(&d) else { continue };
        for e in list.flatten() {
            let p = e.path();
            let Ok(m) = fs::symlink_metadata(&p) else {
                continue;
            };
            if m.file_type().is_dir() {
                stack.push(p.clone());
            }
            out.push((p, m));
        }
    }
    out
}

/// True for overlayfs whiteouts, the only device nodes a layer may hold.
pub fn is_whiteout(m: &fs::Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}
