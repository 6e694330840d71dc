//! SHA-256 digests, diffIDs and chainIDs.

use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Returns the hex part of a well-formed `sha256:<64 lowercase hex>` digest.
/// Anything else (other algorithms, wrong length, upper case) is rejected so
/// that a digest can be used as a file name without further escaping.
pub(crate) fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    is_sha256_hex(hex).then_some(hex)
}

pub(crate) fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// ChainIDs as defined by the OCI image spec:
/// `chain(1) = diff(1)`, `chain(n) = sha256(chain(n-1) + " " + diff(n))`.
pub(crate) fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let next = match out.last() {
            None => diff_id.clone(),
            Some(parent) => sha256_digest(format!("{parent} {diff_id}").as_bytes()),
        };
        out.push(next);
    }
    out
}

/// A reader that hashes and counts every byte that passes through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Reads whatever is left so the digest covers the whole stream, then
    /// returns `(sha256:<hex>, byte count)`.
    pub(crate) fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.count,
        ))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Copies `reader` to `writer`, returning the digest and length of what was
/// copied. Read errors and write errors are reported separately because the
/// first mean a bad archive and the second a host problem.
pub(crate) fn copy_hashed<R: Read, W: Write>(
    reader: &mut R,
    writer: &mut W,
) -> Result<(String, u64), CopyError> {
    let mut hasher = Sha256::new();
    let mut count = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n]).map_err(CopyError::Write)?;
        count += n as u64;
    }
    Ok((format!("sha256:{}", hex::encode(hasher.finalize())), count))
}

#[derive(Debug)]
pub(crate) enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn digest_of_empty_input() {
        assert_eq!(sha256_digest(b""), EMPTY);
        let r = HashingReader::new(&b""[..]);
        assert_eq!(r.finish().unwrap(), (EMPTY.to_string(), 0));
    }

    #[test]
    fn hex_validation_rejects_malformed_digests() {
        assert!(sha256_hex(EMPTY).is_some());
        assert!(sha256_hex("sha512:abcd").is_none());
        assert!(sha256_hex(&EMPTY.to_uppercase()).is_none());
        assert!(sha256_hex("sha256:../../etc/passwd").is_none());
        assert!(sha256_hex(&EMPTY[..70]).is_none());
    }

    #[test]
    fn chain_ids_follow_the_oci_definition() {
        let d1 = sha256_digest(b"one");
        let d2 = sha256_digest(b"two");
        let d3 = sha256_digest(b"three");
        let chains = chain_ids(&[d1.clone(), d2.clone(), d3.clone()]);
        assert_eq!(chains[0], d1);
        let c2 = sha256_digest(format!("{d1} {d2}").as_bytes());
        assert_eq!(chains[1], c2);
        assert_eq!(chains[2], sha256_digest(format!("{c2} {d3}").as_bytes()));
        assert!(chain_ids(&[]).is_empty());
    }

    #[test]
    fn copy_hashed_counts_and_hashes() {
        let mut out = Vec::new();
        let (d, n) = copy_hashed(&mut &b"hello"[..], &mut out).unwrap();
        assert_eq!(n, 5);
        assert_eq!(out, b"hello");
        assert_eq!(d, sha256_digest(b"hello"));
    }
}
