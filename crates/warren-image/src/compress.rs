//! Compression detection by magic bytes.
//!
//! Media types in manifests are not trusted for this: registries and export
//! tools mislabel layers often enough (e.g. docker-archive layers listed as
//! gzip but stored plain) that sniffing is the only reliable way.

use std::io::{self, Cursor, Read};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// OCI media type for a layer stored with this compression.
    pub(crate) fn layer_media_type(self) -> &'static str {
        match self {
            Compression::None => "application/vnd.oci.image.layer.v1.tar",
            Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
        }
    }
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const XZ_MAGIC: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0x00];
const BZIP2_MAGIC: &[u8] = b"BZh";

/// A compression recognised by its magic bytes but not supported; shown
/// as its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unsupported {
    #[error("xz")]
    Xz,
    #[error("bzip2")]
    Bzip2,
}

/// Classifies a stream from its first bytes.
pub(crate) fn sniff(prefix: &[u8]) -> Result<Compression, Unsupported> {
    if prefix.starts_with(GZIP_MAGIC) {
        Ok(Compression::Gzip)
    } else if prefix.starts_with(ZSTD_MAGIC) {
        Ok(Compression::Zstd)
    } else if prefix.starts_with(XZ_MAGIC) {
        Err(Unsupported::Xz)
    } else if prefix.starts_with(BZIP2_MAGIC) {
        Err(Unsupported::Bzip2)
    } else {
        Ok(Compression::None)
    }
}

/// Reads up to `n` bytes without losing them: returns the bytes and a reader
/// that yields the whole stream again.
pub(crate) fn peek<R: Read>(mut reader: R, n: usize) -> io::Result<(Vec<u8>, impl Read)> {
    let mut prefix = Vec::with_capacity(n);
    (&mut reader).take(n as u64).read_to_end(&mut prefix)?;
    Ok((prefix.clone(), Cursor::new(prefix).chain(reader)))
}

/// Wraps `reader` in the decompressor its magic bytes call for.
pub(crate) fn decompress<'a, R: Read + 'a>(
    reader: R,
) -> io::Result<(Compression, Box<dyn Read + 'a>)> {
    let (prefix, reader) = peek(reader, XZ_MAGIC.len())?;
    let compression = sniff(&prefix).map_err(|name| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} compression is not supported; use gzip, zstd or plain tar"),
        )
    })?;
    let out: Box<dyn Read + 'a> = match compression {
        Compression::None => Box::new(reader),
        // Multi-member gzip is valid (pigz and concatenated streams produce it).
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(reader)?),
    };
    Ok((compression, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn sniffs_and_round_trips_each_format() {
        let data = b"plain tar bytes, or close enough".to_vec();

        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).unwrap();
        let gz = gz.finish().unwrap();
        let zs = zstd::encode_all(&data[..], 1).unwrap();

        for (input, want) in [
            (data.clone(), Compression::None),
            (gz, Compression::Gzip),
            (zs, Compression::Zstd),
        ] {
            let (got, mut r) = decompress(&input[..]).unwrap();
            assert_eq!(got, want);
            let mut out = Vec::new();
            r.read_to_end(&mut out).unwrap();
            assert_eq!(out, data);
        }
    }

    #[test]
    fn short_and_unsupported_streams() {
        let (c, mut r) = decompress(&b"a"[..]).unwrap();
        assert_eq!(c, Compression::None);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"a");
        assert!(decompress(&b"BZh91AY"[..]).is_err());
    }
}
