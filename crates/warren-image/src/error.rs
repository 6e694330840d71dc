//! Errors of the image store and how callers should classify them.

use std::io;

/// Coarse class of an [`ImageError`], so API layers can pick a status code
/// without matching on every variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The image (or a part of it) does not exist: HTTP 404.
    NotFound,
    /// The caller sent something unusable (bad reference, corrupt or unsafe
    /// archive): HTTP 400.
    Invalid,
    /// The request clashes with the store's state (ambiguous reference, store
    /// locked by another process): HTTP 409.
    Conflict,
    /// The host failed us (disk full, permissions, corrupt store): HTTP 500.
    Internal,
    /// A registry failed or could not be reached: HTTP 502.
    Upstream,
}

impl ErrorKind {
    /// The HTTP status code that matches this kind.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound => 404,
            ErrorKind::Invalid => 400,
            ErrorKind::Conflict => 409,
            ErrorKind::Internal => 500,
            ErrorKind::Upstream => 502,
        }
    }
}

/// Everything that can go wrong in the image store. Messages name the object
/// at fault and say what the user can do about it.
#[derive(thiserror::Error, Debug)]
pub enum ImageError {
    /// No image (or snapshot) matches; the string is the full message.
    #[error("{0}")]
    NotFound(String),

    /// The registry has no such repository, tag or blob; the string is the
    /// full message.
    #[error("{0}")]
    RemoteNotFound(String),

    /// An image name or reference that cannot be parsed.
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    /// The archive is not an OCI layout or docker-archive tar, or its JSON
    /// documents are malformed or inconsistent.
    #[error("invalid image archive: {0}")]
    InvalidArchive(String),

    /// A registry image whose manifest or config is malformed or not a
    /// container image for this platform.
    #[error("invalid image: {0}")]
    InvalidImage(String),

    /// A blob, layer or config does not hash to the digest that names it.
    #[error("{what}: expected {expected}, got {actual}; the archive is corrupt or was modified after export, re-export it")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },

    /// Content from a registry does not hash to the digest that names it.
    #[error(
        "{what}: expected {expected}, got {actual}; the registry's copy is corrupt or was \
             tampered with, nothing was stored: push the image again"
    )]
    RemoteDigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },

    /// A layer tries something an untrusted image must not do (device nodes,
    /// path escapes, privileged xattrs). The string is the full message.
    #[error("unsafe layer: {0}")]
    UnsafeLayer(String),

    /// The request conflicts with the store's state.
    #[error("{0}")]
    Conflict(String),

    /// Unpacking stopped to keep the node's disk from filling up (a layer
    /// bigger than the free space, or a decompression bomb).
    #[error("{0}")]
    NoRoom(String),

    /// `registries.toml` cannot be read or says something unusable. The
    /// message never quotes the file's text, which holds credentials.
    #[error("registry configuration {path}: {message}")]
    RegistryConfig { path: String, message: String },

    /// The registry refused our credentials (or we sent none and it wants
    /// some). The string is the full message.
    #[error("{0}")]
    RegistryAuth(String),

    /// The registry answered with an error, sent something malformed, or
    /// could not be reached. The string is the full message.
    #[error("{0}")]
    Registry(String),

    /// A host I/O error; `context` says what we were doing and on which path.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// A file written by the store itself could not be parsed.
    #[error("{context}: {source}")]
    CorruptStore {
        context: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ImageError {
    /// Classifies the error for status-code mapping.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ImageError::NotFound(_) | ImageError::RemoteNotFound(_) => ErrorKind::NotFound,
            ImageError::InvalidReference { .. }
            | ImageError::InvalidArchive(_)
            | ImageError::InvalidImage(_)
            | ImageError::DigestMismatch { .. }
            | ImageError::UnsafeLayer(_)
            | ImageError::RegistryConfig { .. }
            | ImageError::RegistryAuth(_) => ErrorKind::Invalid,
            ImageError::Registry(_) | ImageError::RemoteDigestMismatch { .. } => {
                ErrorKind::Upstream
            }
            ImageError::Conflict(_) | ImageError::NoRoom(_) => ErrorKind::Conflict,
            ImageError::Io { .. } | ImageError::CorruptStore { .. } => ErrorKind::Internal,
        }
    }

    /// True when no image or snapshot matched the request.
    pub fn is_not_found(&self) -> bool {
        self.kind() == ErrorKind::NotFound
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> ImageError {
        ImageError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Attaches a lazily built context to I/O results, so every host error says
/// which path and operation failed.
pub(crate) trait IoContext<T> {
    fn ctx<F: FnOnce() -> String>(self, context: F) -> Result<T, ImageError>;
}

impl<T> IoContext<T> for Result<T, io::Error> {
    fn ctx<F: FnOnce() -> String>(self, context: F) -> Result<T, ImageError> {
        self.map_err(|e| ImageError::io(context(), e))
    }
}

impl<T> IoContext<T> for Result<T, rustix::io::Errno> {
    fn ctx<F: FnOnce() -> String>(self, context: F) -> Result<T, ImageError> {
        self.map_err(|e| ImageError::io(context(), e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_http_statuses() {
        assert_eq!(ImageError::NotFound("x".into()).kind().http_status(), 404);
        assert!(ImageError::NotFound("x".into()).is_not_found());
        assert_eq!(
            ImageError::UnsafeLayer("x".into()).kind().http_status(),
            400
        );
        assert_eq!(ImageError::Conflict("x".into()).kind().http_status(), 409);
        let io = ImageError::io("writing x", io::Error::other("boom"));
        assert_eq!(io.kind(), ErrorKind::Internal);
        assert_eq!(io.to_string(), "writing x: boom");
    }

    #[test]
    fn digest_mismatch_message_tells_what_to_do() {
        let e = ImageError::DigestMismatch {
            what: "layer 1".into(),
            expected: "sha256:aa".into(),
            actual: "sha256:bb".into(),
        };
        let msg = e.to_string();
        assert!(msg.contains("expected sha256:aa"), "{msg}");
        assert!(msg.contains("re-export"), "{msg}");
    }
}
