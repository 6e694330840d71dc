//! Random access to the members of an image archive (the outer tar).
//!
//! OCI layouts and docker-archives put their JSON documents and blobs in any
//! order, so the archive is indexed once (headers only, data is seeked over)
//! and members are then read by offset. A compressed archive (`docker save |
//! gzip`) is first decompressed into the import's scratch directory.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::compress::{self, Compression};
use crate::error::{ImageError, IoContext};

/// Symlink/hardlink hops followed when resolving a member before we assume a
/// loop.
const MAX_LINK_HOPS: usize = 32;

#[derive(Debug, Clone)]
enum Member {
    File {
        offset: u64,
        size: u64,
    },
    /// Symlinks are stored already resolved against the link's directory, so
    /// both link kinds hold an archive-root-relative target.
    Link(String),
    /// Directories, sparse files and other entries we never read.
    Unreadable,
}

pub(crate) struct SourceArchive {
    /// The path the caller gave, for messages.
    display: String,
    file: File,
    members: HashMap<String, Member>,
}

impl SourceArchive {
    /// Indexes `path`. `scratch` is a private directory where a compressed
    /// archive may be decompressed.
    pub(crate) fn open(path: &Path, scratch: &Path) -> Result<SourceArchive, ImageError> {
        let display = path.display().to_string();
        let mut file = File::open(path).ctx(|| {
            format!("opening image archive {display} (check that the file exists and is readable)")
        })?;

        let mut magic = [0u8; 6];
        let n = file
            .read_at(&mut magic, 0)
            .ctx(|| format!("reading image archive {display}"))?;
        match compress::sniff(&magic[..n]) {
            Ok(Compression::None) => {}
            Ok(_) => file = decompress_to(&file, &display, &scratch.join("archive.tar"))?,
            Err(name) => {
                return Err(ImageError::InvalidArchive(format!(
                    "{display} is {name}-compressed; decompress it or use gzip/zstd"
                )))
            }
        }

        let members = index_members(&file, &display)?;
        Ok(SourceArchive {
            display,
            file,
            members,
        })
    }

    pub(crate) fn display(&self) -> &str {
        &self.display
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.members.contains_key(name)
    }

    /// Offset and size of the data of `name`, following links.
    fn locate(&self, name: &str) -> Result<(u64, u64), ImageError> {
        let mut current = name.to_string();
        for _ in 0..MAX_LINK_HOPS {
            match self.members.get(&current) {
                None => {
                    return Err(ImageError::InvalidArchive(format!(
                        "{}: member {name} is missing{}; the archive is incomplete, re-export it",
                        self.display,
                        if current != name {
                            format!(" (link target {current})")
                        } else {
                            String::new()
                        }
                    )))
                }
                Some(Member::File { offset, size }) => return Ok((*offset, *size)),
                Some(Member::Link(target)) => current = target.clone(),
                Some(Member::Unreadable) => {
                    return Err(ImageError::InvalidArchive(format!(
                        "{}: member {current} is not a regular file",
                        self.display
                    )))
                }
            }
        }
        Err(ImageError::InvalidArchive(format!(
            "{}: member {name} is a link loop",
            self.display
        )))
    }

    /// Size of member `name`.
    pub(crate) fn size(&self, name: &str) -> Result<u64, ImageError> {
        self.locate(name).map(|(_, size)| size)
    }

    /// A reader over the data of member `name`.
    pub(crate) fn open_member(&self, name: &str) -> Result<MemberReader<'_>, ImageError> {
        let (offset, size) = self.locate(name)?;
        Ok(MemberReader {
            file: &self.file,
            pos: offset,
            end: offset.saturating_add(size),
        })
    }

    /// Reads a small member (a JSON document) fully, refusing anything over
    /// `limit` bytes so a hostile archive cannot make us allocate gigabytes.
    pub(crate) fn read_small(&self, name: &str, limit: u64) -> Result<Vec<u8>, ImageError> {
        let size = self.size(name)?;
        if size > limit {
            return Err(ImageError::InvalidArchive(format!(
                "{}: {name} is {size} bytes, more than the {limit}-byte limit for JSON documents",
                self.display
            )));
        }
        let mut buf = Vec::with_capacity(size as usize);
        self.open_member(name)?
            .read_to_end(&mut buf)
            .ctx(|| format!("reading {name} from {}", self.display))?;
        Ok(buf)
    }
}

/// Positional reader over one member; it uses `pread` so several readers may
/// share the file.
pub(crate) struct MemberReader<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for MemberReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end.saturating_sub(self.pos);
        if left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "archive is truncated",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

fn decompress_to(src: &File, display: &str, dest: &Path) -> Result<File, ImageError> {
    let (_, mut reader) =
        compress::decompress(src).ctx(|| format!("reading compressed image archive {display}"))?;
    let mut out = File::create_new(dest).ctx(|| format!("creating {}", dest.display()))?;
    io::copy(&mut reader, &mut out).map_err(|e| {
        ImageError::InvalidArchive(format!(
            "{display}: decompressing failed ({e}); the archive is corrupt or truncated"
        ))
    })?;
    File::open(dest).ctx(|| format!("reopening {}", dest.display()))
}

fn index_members(file: &File, display: &str) -> Result<HashMap<String, Member>, ImageError> {
    let bad = |e: io::Error| {
        ImageError::InvalidArchive(format!(
            "{display} is not a readable tar archive ({e}); export the image with \
             `skopeo copy ... oci-archive:FILE` or `docker save -o FILE`"
        ))
    };
    let mut tar = tar::Archive::new(file);
    let mut members = HashMap::new();
    for entry in tar.entries_with_seek().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        let Some(name) = normalize(&entry.path_bytes()) else {
            continue;
        };
        let kind = entry.header().entry_type();
        let member = if kind.is_file() || kind == tar::EntryType::Continuous {
            Member::File {
                offset: entry.raw_file_position(),
                size: entry.size(),
            }
        } else if kind.is_symlink() || kind.is_hard_link() {
            let target = entry.link_name_bytes().unwrap_or_default();
            let joined = if kind.is_symlink() && !target.starts_with(b"/") {
                // A symlink is relative to its own directory.
                let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                let mut p = dir.as_bytes().to_vec();
                p.push(b'/');
                p.extend_from_slice(&target);
                p
            } else {
                target.into_owned()
            };
            match normalize(&joined) {
                Some(t) => Member::Link(t),
                None => Member::Unreadable,
            }
        } else {
            Member::Unreadable
        };
        members.insert(name, member);
    }
    Ok(members)
}

/// Archive-root-relative form of a member name: no leading `/` or `./`, no
/// `.` components, `..` applied lexically (never above the root). Names that
/// are not UTF-8 or that name the root itself yield `None`.
pub(crate) fn normalize(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    let mut parts: Vec<&str> = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    }
}

/// Member name of a blob in an OCI layout.
pub(crate) fn blob_member(hex: &str) -> String {
    format!("blobs/sha256/{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_member_names() {
        assert_eq!(normalize(b"./index.json").as_deref(), Some("index.json"));
        assert_eq!(normalize(b"/a//b/./c").as_deref(), Some("a/b/c"));
        assert_eq!(normalize(b"a/../../b").as_deref(), Some("b"));
        assert_eq!(normalize(b"./"), None);
        assert_eq!(normalize(b"\xff"), None);
    }

    fn build(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut b = tar::Builder::new(f.reopen().unwrap());
        for (name, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if let Some(l) = link {
                h.set_link_name(l).unwrap();
            }
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.finish().unwrap();
        f
    }

    #[test]
    fn reads_members_and_follows_links() {
        let f = build(&[
            ("./a/layer.tar", tar::EntryType::Regular, b"LAYER", None),
            (
                "b/layer.tar",
                tar::EntryType::Symlink,
                b"",
                Some("../a/layer.tar"),
            ),
            ("c", tar::EntryType::Link, b"", Some("a/layer.tar")),
            ("loop1", tar::EntryType::Symlink, b"", Some("loop2")),
            ("loop2", tar::EntryType::Symlink, b"", Some("loop1")),
            ("big.json", tar::EntryType::Regular, &[b' '; 100], None),
        ]);
        let scratch = tempfile::tempdir().unwrap();
        let a = SourceArchive::open(f.path(), scratch.path()).unwrap();
        for name in ["a/layer.tar", "b/layer.tar", "c"] {
            assert_eq!(a.read_small(name, 10).unwrap(), b"LAYER", "{name}");
        }
        assert!(matches!(
            a.read_small("loop1", 10),
            Err(ImageError::InvalidArchive(_))
        ));
        assert!(matches!(
            a.read_small("missing", 10),
            Err(ImageError::InvalidArchive(_))
        ));
        assert!(a.read_small("big.json", 10).is_err());
        assert!(a.contains("a/layer.tar"));
    }

    #[test]
    fn gzip_compressed_archives_are_accepted() {
        use std::io::Write;
        let plain = build(&[("x", tar::EntryType::Regular, b"hello", None)]);
        let bytes = std::fs::read(plain.path()).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        let gz_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(gz_file.path(), gz.finish().unwrap()).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let a = SourceArchive::open(gz_file.path(), scratch.path()).unwrap();
        assert_eq!(a.read_small("x", 10).unwrap(), b"hello");
    }

    #[test]
    fn garbage_is_not_an_archive() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), vec![7u8; 2048]).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let err = SourceArchive::open(f.path(), scratch.path()).err().unwrap();
        assert!(matches!(err, ImageError::InvalidArchive(_)), "{err}");
    }
}
