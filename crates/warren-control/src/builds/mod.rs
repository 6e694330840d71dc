//! Image builds: a Dockerfile run step by step in Warren sandboxes on one
//! node, each step's result kept in that node's step cache (see
//! [`engine`]). What a client can look at of each (its events, live and
//! afterwards) is kept in `crate::build_log`.

mod context;
mod copy;
mod dockerfile;
mod engine;
mod state;
mod words;

use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_core::build::{BuildEvent, BuildInfo, BuildRequest};
use warren_core::tenant::Principal;
use warren_core::ApiError;

pub(crate) use crate::build_log::Build;
use crate::build_log::KEPT_FINISHED;
use crate::control::Control;
use crate::streams::ByteStream;

/// A tar archive's bytes as `reader` holds them, gzip or plain (ADD of a
/// local archive, E2B's uploads: neither says which).
pub fn tar_bytes<'a, R: std::io::Read + 'a>(
    reader: R,
) -> std::io::Result<Box<dyn std::io::Read + 'a>> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(reader);
    let gzip = reader.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip {
        Box::new(flate2::read::GzDecoder::new(reader))
    } else {
        Box::new(reader)
    })
}

impl Control {
    /// Starts a build of `context` (a tar archive): answers its events as
    /// they come, the first naming its id. The build runs in its own
    /// task: a client that leaves does not stop it.
    /// It is `who`'s tenant's: its steps run in that tenant's sandboxes
    /// (its quota, its egress policy), its `FROM`s are images that tenant
    /// may run, and its tag is claimed for it.
    pub async fn start_build(
        self: &Arc<Self>,
        who: &Principal,
        req: BuildRequest,
        context: ByteStream,
    ) -> Result<BoxStream<'static, BuildEvent>, ApiError> {
        self.lifecycle.refuse_if_stopping()?;
        req.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let tenant = crate::access::changer(who)?;
        if req.push.is_some() && !tenant.is_default() {
            return Err(ApiError::new(
                warren_core::ErrorCode::Forbidden,
                "push is the operator's: a tenant's build keeps its image in the cluster (leave out --push)",
            ));
        }
        if let Some(tag) = &req.tag {
            self.images.claim(who, tag).await?;
        }
        let spooled = spool(context).await?;
        let id = crate::control::new_id_with("bld");
        let build = Arc::new(Build::new(&id, req.tag.clone(), tenant));
        build.emit(BuildEvent::Build { id: id.clone() });
        self.builds.keep(&id, build.clone());
        let this = self.clone();
        let runner = build.clone();
        tokio::spawn(async move { engine::run(this, runner, req, spooled).await });
        Ok(build.follow())
    }

    /// A build of `who`'s as it stands (running or among the recent
    /// finished); another tenant's is no build at all.
    pub fn build_info(&self, who: &Principal, id: &str) -> Result<BuildInfo, ApiError> {
        self.builds.info(who, id).ok_or_else(|| {
            ApiError::not_found(format!(
                "no build {id} (finished builds are kept for the last {KEPT_FINISHED})"
            ))
        })
    }
}

/// Writes the uploaded context to an anonymous temporary file, refusing
/// more than [`context::MAX_CONTEXT`] bytes.
async fn spool(mut body: ByteStream) -> Result<std::fs::File, ApiError> {
    use tokio::io::AsyncWriteExt;
    let internal =
        |e: std::io::Error| ApiError::internal(format!("spooling the build context: {e}"));
    let file = tempfile::tempfile().map_err(internal)?;
    let mut out = tokio::fs::File::from_std(file.try_clone().map_err(internal)?);
    let mut total = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(format!("the build context upload broke off: {e}"))
        })?;
        total += chunk.len() as u64;
        if total > context::MAX_CONTEXT {
            return Err(ApiError::bad_request(
                context::ContextError::TooLarge.to_string(),
            ));
        }
        out.write_all(&chunk).await.map_err(internal)?;
    }
    out.flush().await.map_err(internal)?;
    Ok(file)
}
