//! Pushing a stored image to a registry: the blobs it lacks, then the
//! manifest exactly as stored, so the image keeps its digest.

use futures_util::stream;
use http::HeaderValue;
use oci_client::RegistryOperation;
use tokio::io::AsyncReadExt;

use crate::digest::sha256_hex;
use crate::error::ImageError;
use crate::record::ImageRecord;
use crate::session::Session;
use crate::store::ImageStore;

/// Upload chunk size: the registry gets one PATCH per chunk.
const CHUNK: usize = 4 << 20;

/// What a push sent.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Pushed {
    /// Blobs uploaded from the store.
    pub uploaded: usize,
    /// Blobs the registry copied from the image's source repository.
    pub mounted: usize,
}

/// Pushes `record`; blobs the target repository has are skipped, blobs its
/// source repository on the same registry has are mounted from there.
pub(crate) async fn push(
    store: &ImageStore,
    s: &Session,
    record: &ImageRecord,
) -> Result<Pushed, ImageError> {
    let manifest = store.read_blob(&record.digest)?;
    let media_type = serde_json::from_slice::<serde_json::Value>(&manifest)
        .ok()
        .and_then(|v| v["mediaType"].as_str().map(str::to_string))
        .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".to_string());
    let content_type = HeaderValue::from_str(&media_type).map_err(|_| {
        ImageError::InvalidImage(format!(
            "manifest {} of {} has media type {media_type:?}",
            record.digest, record.name
        ))
    })?;
    // Authenticates for push once (and caches the token) before the
    // uploads, so a credentials problem is reported as such.
    s.client
        .auth(&s.repo, &s.auth, RegistryOperation::Push)
        .await
        .map_err(s.fail(&format!("push access to {}", s.origin)))?;

    // Mounting needs the source on the same registry and another repository.
    let mount_from = record
        .source
        .as_deref()
        .and_then(|src| src.split_once('/'))
        .filter(|(host, repo)| *host == s.repo.registry() && *repo != s.repo.repository())
        .map(|(host, repo)| {
            oci_client::Reference::with_tag(host.to_string(), repo.to_string(), "latest".into())
        });
    let mut pushed = Pushed::default();
    let blobs = record
        .layers
        .iter()
        .map(|l| l.digest.as_str())
        .chain([record.config_digest.as_str()]);
    for digest in blobs {
        let what = format!("blob {digest} of {}", s.origin);
        let exists = s
            .client
            .blob_exists(&s.repo, digest)
            .await
            .map_err(s.fail(&what))?;
        if exists {
            continue;
        }
        if let Some(from) = &mount_from {
            // A registry that cannot mount answers 202 and opens an upload
            // instead (left to expire); then the blob is uploaded.
            if s.client.mount_blob(&s.repo, from, digest).await.is_ok() {
                pushed.mounted += 1;
                continue;
            }
        }
        let path = store.blob_path(sha256_hex(digest).unwrap_or_default());
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| ImageError::io(format!("opening {}", path.display()), e))?;
        let size = file
            .metadata()
            .await
            .map_err(|e| ImageError::io(format!("reading {}", path.display()), e))?
            .len();
        let chunks = stream::unfold(file, |mut f| async move {
            let mut buf = vec![0u8; CHUNK];
            match f.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), f))
                }
                Err(e) => Some((Err(oci_client::errors::OciDistributionError::IoError(e)), f)),
            }
        });
        s.client
            .push_blob_stream(&s.repo, chunks, digest, Some(size))
            .await
            .map_err(s.fail(&what))?;
        pushed.uploaded += 1;
    }
    s.client
        .push_manifest_raw(&s.repo, manifest, content_type)
        .await
        .map_err(s.fail(&format!("manifest {} of {}", record.digest, s.origin)))?;
    Ok(pushed)
}
