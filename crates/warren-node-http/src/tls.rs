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
use warren_node_api::{join_statement, JoinRequest, KeyProof};

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
    Generate(#[source] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
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

    /// A proof, for a join as `name` at `url`, that this node holds the
    /// key of its certificate: the key signs [`join_statement`].
    pub fn prove_join(&self, name: &str, url: &str, now: i64) -> Result<KeyProof, TlsError> {
        use base64::Engine;
        let signing = provider()
            .key_provider
            .load_private_key(self.key.clone_key())
            .map_err(|e| TlsError::Config(format!("the node's key: {e}")))?;
        let signer = signing.choose_scheme(PROOF_SCHEMES).ok_or_else(|| {
            TlsError::Config("the node's key signs none of ECDSA P-256, Ed25519 or RSA-PSS".into())
        })?;
        let statement = join_statement(name, url, &self.fingerprint(), now);
        let signature = signer
            .sign(&statement)
            .map_err(|e| TlsError::Config(format!("signing the join: {e}")))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok(KeyProof {
            certificate: b64.encode(self.cert.as_ref()),
            signed_at: now,
            signature: b64.encode(signature),
            scheme: format!("{:?}", signer.scheme()),
        })
    }

    /// A TLS acceptor for the node API (HTTP/1.1 only: the port tunnel is
    /// an HTTP/1 upgrade).
    pub fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], self.key.clone_key())?;
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
        .map_err(TlsError::Generate)?;
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

/// What a join proof may be signed with.
const PROOF_SCHEMES: &[SignatureScheme] = &[
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ED25519,
    SignatureScheme::RSA_PSS_SHA256,
];

/// How far a proof's time may be from the control plane's clock.
const PROOF_SKEW_S: i64 = 300;

/// Why a join's proof that it holds its certificate's key was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JoinProofError {
    /// An older node pins a certificate but sends no proof.
    #[error("a join that pins a certificate must prove it holds its key (tls_proof): update the node's warren")]
    Missing,
    #[error("the join proof was signed at {signed_at} but it is {now} here: the node's and the server's clocks differ by more than {PROOF_SKEW_S} s")]
    Skew { signed_at: i64, now: i64 },
    /// `field` of the proof is not base64.
    #[error("{field}: {source}")]
    Base64 {
        field: &'static str,
        source: base64::DecodeError,
    },
    #[error("tls_proof.certificate is not the certificate tls_fingerprint names")]
    NotThePin,
    /// webpki's errors print as their variant's name only.
    #[error("tls_proof.certificate: {0:?}")]
    Certificate(#[source] webpki::Error),
    #[error("tls_proof.scheme {0:?} is not one Warren accepts")]
    Scheme(String),
    #[error("tls_proof.signature is not this join's, signed by the certificate's key")]
    Signature,
}

/// Checks that `req` comes from the holder of the key of the certificate
/// it pins (`now`: unix seconds): its proof's certificate has the pinned
/// SHA-256 and its key signed this join's name, URL and fingerprint,
/// within minutes of now. A join without a pin needs no proof.
pub fn check_join_proof(req: &JoinRequest, now: i64) -> Result<(), JoinProofError> {
    use base64::Engine;
    let Some(pin) = req.tls_fingerprint.as_deref() else {
        return Ok(());
    };
    let proof = req.tls_proof.as_ref().ok_or(JoinProofError::Missing)?;
    if (proof.signed_at - now).abs() > PROOF_SKEW_S {
        return Err(JoinProofError::Skew {
            signed_at: proof.signed_at,
            now,
        });
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let decode = |field, text: &str| {
        b64.decode(text)
            .map_err(|source| JoinProofError::Base64 { field, source })
    };
    let cert = decode("tls_proof.certificate", &proof.certificate)?;
    let signature = decode("tls_proof.signature", &proof.signature)?;
    use subtle::ConstantTimeEq;
    if !bool::from(fingerprint(&cert).as_bytes().ct_eq(pin.as_bytes())) {
        return Err(JoinProofError::NotThePin);
    }
    let der = CertificateDer::from(cert);
    let cert = webpki::EndEntityCert::try_from(&der).map_err(JoinProofError::Certificate)?;
    let algorithms = provider()
        .signature_verification_algorithms
        .mapping
        .iter()
        .find(|(scheme, _)| PROOF_SCHEMES.contains(scheme) && format!("{scheme:?}") == proof.scheme)
        .map(|(_, algs)| *algs)
        .ok_or_else(|| JoinProofError::Scheme(proof.scheme.clone()))?;
    let statement = join_statement(&req.info.name, &req.url, pin, proof.signed_at);
    if algorithms
        .iter()
        .any(|alg| cert.verify_signature(*alg, &statement, &signature).is_ok())
    {
        Ok(())
    } else {
        Err(JoinProofError::Signature)
    }
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
        .with_safe_default_protocol_versions()?
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
    fn a_join_proof_binds_the_key_to_the_name_url_and_time() {
        let (a, b) = (
            tempfile::tempdir().expect("a"),
            tempfile::tempdir().expect("b"),
        );
        let (a, b) = (
            Identity::load_or_create(a.path()).expect("a"),
            Identity::load_or_create(b.path()).expect("b"),
        );
        let now = 1_800_000_000;
        let info = warren_node_api::NodeInfo {
            name: "n1".into(),
            labels: Default::default(),
            allocatable: Default::default(),
            max_pids: 0,
            load: Default::default(),
            images: Vec::new(),
            devices: Vec::new(),
            isolation: Vec::new(),
        };
        let req = |id: &Identity, url: &str, proof: Option<KeyProof>| JoinRequest {
            url: url.into(),
            info: info.clone(),
            tls_fingerprint: Some(id.fingerprint()),
            tls_proof: proof,
        };
        let proof = a.prove_join("n1", "https://a:1", now).expect("prove");
        assert_eq!(
            check_join_proof(&req(&a, "https://a:1", Some(proof.clone())), now),
            Ok(())
        );
        assert_eq!(
            check_join_proof(&req(&a, "https://a:1", Some(proof.clone())), now + 200),
            Ok(())
        );
        // Another time, URL, key or no proof at all: refused.
        assert!(matches!(
            check_join_proof(&req(&a, "https://a:1", Some(proof.clone())), now + 400),
            Err(JoinProofError::Skew { .. })
        ));
        assert_eq!(
            check_join_proof(&req(&a, "https://evil:1", Some(proof.clone())), now),
            Err(JoinProofError::Signature)
        );
        assert_eq!(
            check_join_proof(&req(&b, "https://a:1", Some(proof.clone())), now),
            Err(JoinProofError::NotThePin)
        );
        let b_proof = b.prove_join("n1", "https://a:1", now).expect("prove");
        let mut stolen = req(&a, "https://a:1", Some(b_proof));
        assert_eq!(
            check_join_proof(&stolen, now),
            Err(JoinProofError::NotThePin),
            "b's key, a's pin"
        );
        stolen.tls_proof = None;
        assert_eq!(check_join_proof(&stolen, now), Err(JoinProofError::Missing));
        // A plain-HTTP node pins nothing and proves nothing.
        stolen.tls_fingerprint = None;
        assert_eq!(check_join_proof(&stolen, now), Ok(()));
    }

    #[test]
    fn a_pin_must_be_a_sha256() {
        assert!(pinned_client_config("abc").is_err());
        assert!(pinned_client_config(&"g".repeat(64)).is_err());
        assert!(pinned_client_config(&"A".repeat(64)).is_ok());
    }
}
