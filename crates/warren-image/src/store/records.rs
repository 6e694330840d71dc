//! Image records: one JSON file per image name, and finding them by name
//! or digest.

use std::collections::HashSet;
use std::fs;
use std::io;

use super::ImageStore;
use crate::digest::sha256_hex;
use crate::error::{ImageError, IoContext};
use crate::fsutil::write_atomic;
use crate::record::ImageRecord;
use crate::reference::{parse_reference, Reference};

impl ImageStore {
    /// All images but build steps' results, sorted by name. Unreadable
    /// records are skipped (and logged) so one damaged file does not hide
    /// every image.
    pub fn list(&self) -> Result<Vec<ImageRecord>, ImageError> {
        let mut all = self.load_records(false)?;
        all.retain(|r| !crate::steps::is_step_name(&r.name));
        Ok(all)
    }

    /// Finds an image by `repo:tag`, `repo` (= `repo:latest`), `sha256:<hex>`
    /// or a unique digest prefix of at least 12 hex digits (with or without
    /// `sha256:`). When several names share a digest, the first by name is
    /// returned.
    pub fn resolve(&self, reference: &str) -> Result<ImageRecord, ImageError> {
        self.lookup(reference).map(|(record, _)| record)
    }

    /// Writes `record` under its name; true when that replaced a record of
    /// another digest (whose content may now be garbage).
    pub(super) fn write_record(&self, record: &ImageRecord) -> Result<bool, ImageError> {
        let previous = self.read_record(&record.name).ok().flatten();
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| ImageError::io("encoding image record", io::Error::other(e)))?;
        write_atomic(&self.record_path(&record.name), &bytes, &self.tmp_dir())?;
        let Some(previous) = previous.filter(|p| p.digest != record.digest) else {
            return Ok(false);
        };
        // A sandbox still runs the image the name named until now: keep it
        // reachable as repo@digest, so a restart (whose pins start empty)
        // neither collects its layers nor fails to adopt the sandbox.
        if self.is_pinned(&previous.digest) && !previous.name.contains('@') {
            let repo = previous
                .name
                .rsplit_once(':')
                .map_or(previous.name.as_str(), |(repo, _)| repo);
            let kept = ImageRecord {
                name: format!("{repo}@{}", previous.digest),
                ..previous.clone()
            };
            let bytes = serde_json::to_vec_pretty(&kept)
                .map_err(|e| ImageError::io("encoding image record", io::Error::other(e)))?;
            write_atomic(&self.record_path(&kept.name), &bytes, &self.tmp_dir())?;
            tracing::info!(name = %kept.name, "image still in use kept under its digest");
        }
        Ok(true)
    }

    /// The record a reference names, and whether it was found by digest.
    pub(super) fn lookup(&self, reference: &str) -> Result<(ImageRecord, bool), ImageError> {
        match parse_reference(reference)? {
            Reference::Name(name) => self
                .read_record(&name)?
                .map(|r| (r, false))
                .ok_or_else(|| not_found(reference)),
            Reference::Digest(hex) => Ok((self.by_digest(&hex, reference)?, true)),
            Reference::NameOrDigest(name, hex) => match self.read_record(&name)? {
                Some(record) => Ok((record, false)),
                None => Ok((self.by_digest(&hex, reference)?, true)),
            },
        }
    }

    fn by_digest(&self, prefix: &str, reference: &str) -> Result<ImageRecord, ImageError> {
        let matches: Vec<ImageRecord> = self
            .load_records(false)?
            .into_iter()
            .filter(|r| sha256_hex(&r.digest).is_some_and(|h| h.starts_with(prefix)))
            .collect();
        let digests: HashSet<&str> = matches.iter().map(|r| r.digest.as_str()).collect();
        if digests.len() > 1 {
            let mut listed: Vec<&str> = digests.into_iter().collect();
            listed.sort_unstable();
            return Err(ImageError::Conflict(format!(
                "{reference} matches several images ({}); give more digits",
                listed.join(", ")
            )));
        }
        // load_records sorts by name, so this is the first name.
        matches
            .into_iter()
            .next()
            .ok_or_else(|| not_found(reference))
    }

    pub(super) fn read_record(&self, name: &str) -> Result<Option<ImageRecord>, ImageError> {
        let path = self.record_path(name);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ImageError::io(format!("reading {}", path.display()), e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| ImageError::CorruptStore {
                context: format!(
                    "image record {} is damaged; remove the file and re-import the image",
                    path.display()
                ),
                source,
            })
    }

    /// Records sorted by name. `strict` fails on a damaged record (GC must
    /// know every reference); otherwise damaged records are skipped.
    pub(super) fn load_records(&self, strict: bool) -> Result<Vec<ImageRecord>, ImageError> {
        let dir = self.images_dir();
        let mut records = Vec::new();
        for entry in fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let path = entry.ctx(|| format!("listing {}", dir.display()))?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let parsed = fs::read(&path)
                .ctx(|| format!("reading {}", path.display()))
                .and_then(|b| {
                    serde_json::from_slice::<ImageRecord>(&b).map_err(|source| {
                        ImageError::CorruptStore {
                            context: format!(
                                "image record {} is damaged; remove the file and re-import the \
                                 image",
                                path.display()
                            ),
                            source,
                        }
                    })
                });
            match parsed {
                Ok(r) => records.push(r),
                Err(e) if strict => return Err(e),
                Err(e) => tracing::warn!(error = %e, "skipping unreadable image record"),
            }
        }
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }
}

fn not_found(reference: &str) -> ImageError {
    ImageError::NotFound(format!(
        "image {reference:?} not found in the store; import it first or check the name"
    ))
}
