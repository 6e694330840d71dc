//! TLS on the node API without a certificate authority. A node makes a
//! self-signed certificate once (kept in its home) and tells the control
//! plane the certificate's SHA-256 when it joins, over the same request
//! that carries its join token; the control plane then accepts exactly
//! that certificate from that node (pinning), so the node credential and
//! everything the node API carries are encrypted, and a host that takes
//! over the node's address cannot pose as it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}; remove the directory to make a new certificate (the node must then join again)", path.display())]
    Unreadable { path: PathBuf, message: String },
    #[error("making the node's certificate: {0}")]
    Generate(String),
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The node's certificate and key.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

impl Identity {
    /// The identity kept in `dir` (`cert.pem`, `key.pem`), made there the
    /// first time. The key file is readable by root only.
    pub fn load_or_create(dir: &Path) -> Result<Identity, TlsError> {
        let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
        if !cert_path.exists() || !key_path.exists() {
            make(dir, &cert_path, &key_path)?;
        }
        let unreadable = |path: &Path, e: rustls::pki_types::pem::Error| TlsError::Unreadable {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let cert =
            CertificateDer::from_pem_file(&cert_path).map_err(|e| unreadable(&cert_path, e))?;
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| unreadable(&key_path, e))?;
        Ok(Identity { cert, key })
    }

    /// What the control plane pins: the certificate's SHA-256, in hex.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.cert)
    }

    /// A TLS acceptor for the node API (HTTP/1.1 only: the port tunnel is
    /// an HTTP/1 upgrade).
    pub fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], self.key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

fn make(dir: &Path, cert_path: &Path, key_path: &Path) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    // The name is never checked (the certificate is pinned), but clients
    // and tools show it.
    let made = rcgen::generate_simple_self_signed(vec!["warren-node".to_string()])
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    let write = |path: &Path, text: String, mode: u32| -> Result<(), TlsError> {
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io(&tmp))?;
        f.write_all(text.as_bytes()).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))
    };
    // The key first: a certificate without its key would be kept and fail.
    write(key_path, made.signing_key.serialize_pem(), 0o600)?;
    write(cert_path, made.cert.pem(), 0o644)
}

/// The hex SHA-256 of a DER certificate.
pub fn fingerprint(cert: &[u8]) -> String {
    hex::encode(Sha256::digest(cert))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client side: accepts the one certificate whose SHA-256 is `pin`,
/// whatever name it carries, and checks that the server holds its key.
pub(crate) fn pinned_client_config(pin: &str) -> Result<rustls::ClientConfig, TlsError> {
    let pin = pin.trim().to_ascii_lowercase();
    if pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TlsError::Config(format!(
            "node certificate pin {pin:?} is not a SHA-256 in hex (64 characters)"
        )));
    }
    let provider = provider();
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned { pin, provider }))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[derive(Debug)]
struct Pinned {
    pin: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use subtle::ConstantTimeEq;
        let seen = fingerprint(end_entity);
        if bool::from(seen.as_bytes().ct_eq(self.pin.as_bytes())) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the node's certificate (SHA-256 {seen}) is not the one it joined with ({}): \
                 another host answers at its address, or the node's home lost its node-tls \
                 directory (then it must join again)",
                self.pin
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_made_once_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Identity::load_or_create(dir.path()).expect("make");
        let b = Identity::load_or_create(dir.path()).expect("load");
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 64);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("key.pem"))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(a.acceptor().is_ok());
    }

    #[test]
    fn a_pin_must_be_a_sha256() {
        assert!(pinned_client_config("abc").is_err());
        assert!(pinned_client_config(&"g".repeat(64)).is_err());
        assert!(pinned_client_config(&"A".repeat(64)).is_ok());
    }
}
