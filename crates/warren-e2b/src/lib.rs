//! E2B's protocols on Warren, so code written for the E2B SDK (Python or
//! JavaScript) runs unchanged with `E2B_API_URL`, `E2B_SANDBOX_URL` and
//! `E2B_API_KEY` pointed at Warren:
//!
//! * the control API (`api`): create, list, connect, timeout, pause, kill,
//!   metrics — each a call on Warren's control plane;
//! * the sandbox side (`envd`): the per-sandbox daemon's Connect-JSON
//!   services (`process.Process`, `filesystem.Filesystem`), `/files` and
//!   `/health`, routed by the `E2b-Sandbox-Id` header.
//!
//! Both listen on their own addresses (E2B's control API must ignore the
//! sandbox headers some SDK versions send it). They answer through the
//! control plane the daemon runs; a server replica that does not lead
//! answers 503 with Retry-After, which the SDK retries.

use std::path::Path;
use std::sync::Arc;

use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use warren_control::Control;
use warren_control::ControlCell;
use warren_control::Signer;
use warren_core::tenant::Principal;

mod access;
pub mod api;
pub mod connect;
pub mod envd;
mod reply;
pub mod secrets;
pub mod snapshots;
pub mod template_api;
pub mod template_builds;
pub mod templates;
pub mod volumes;

/// The envd version Warren reports: the SDK turns features on by it, and
/// 0.6.4 is the highest whose features (stdin-less starts, octet-stream and
/// gzip uploads, file metadata as `user.e2b.*` xattrs, entries in watch
/// events, the network-mounts watch flag) Warren serves.
pub const ENVD_VERSION: &str = "0.6.4";

/// The port envd listens on in an E2B sandbox; requests for any other port
/// go to that port inside the sandbox.
pub const ENVD_PORT: u16 = 49983;

/// The label that marks sandboxes made through E2B's API (what its list
/// shows).
pub const FRONT_LABEL: (&str, &str) = ("warren.dev/front", "e2b");
/// The template a sandbox was made from, when it is a valid label value.
pub const TEMPLATE_LABEL: &str = "e2b.dev/template";
/// On a sandbox made with E2B's `autoResume`: the timeout (seconds) it gets
/// again when traffic resumes it.
pub const AUTO_RESUME_LABEL: &str = "e2b.dev/auto-resume";
/// On a sandbox made with `allowPublicTraffic: false`: its ports take only
/// requests that carry its traffic token.
pub const PRIVATE_TRAFFIC_LABEL: &str = "e2b.dev/private-traffic";
/// E2B's `maskRequestHost`, kept as its host and its port (`port`: the
/// port the request went to, E2B's `${PORT}`).
pub const MASK_HOST_LABEL: &str = "e2b.dev/mask-host";
pub const MASK_PORT_LABEL: &str = "e2b.dev/mask-port";
/// Warren's labels on E2B sandboxes, not shown as E2B metadata.
pub const INTERNAL_LABELS: [&str; 6] = [
    FRONT_LABEL.0,
    TEMPLATE_LABEL,
    AUTO_RESUME_LABEL,
    PRIVATE_TRAFFIC_LABEL,
    MASK_HOST_LABEL,
    MASK_PORT_LABEL,
];

/// The domain sandboxes' hosts are below (`--e2b-domain`): E2B's SDKs
/// name a sandbox's port `PORT-ID.DOMAIN` (`get_host`), and the sandbox
/// door routes a request by that Host. It needs wildcard DNS (`*.DOMAIN`)
/// to the door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxDomain(String);

#[derive(Debug, thiserror::Error)]
#[error("--e2b-domain {0:?}: a DNS name such as sandbox.example.com")]
pub struct DomainError(String);

impl std::str::FromStr for SandboxDomain {
    type Err = DomainError;

    fn from_str(s: &str) -> Result<Self, DomainError> {
        match warren_core::network::normalize_host(s) {
            Ok(warren_core::network::Target::Name(n)) => Ok(SandboxDomain(n)),
            _ => Err(DomainError(s.to_string())),
        }
    }
}

impl SandboxDomain {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The sandbox and port a Host below the domain names
    /// (`PORT-ID.DOMAIN`, any `:port` of the door's own aside).
    pub fn target(&self, host: &str) -> Option<(String, u16)> {
        let host = host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        });
        let host = host.to_ascii_lowercase();
        let label = host.strip_suffix(&self.0)?.strip_suffix('.')?;
        let (port, id) = label.split_once('-')?;
        let port = port.parse().ok().filter(|p| *p != 0)?;
        (!id.is_empty() && !id.contains('.')).then(|| (id.to_string(), port))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("E2B templates: {0}")]
    Templates(#[from] templates::TemplateError),
    #[error("E2B template builds: {0}")]
    Builds(#[from] template_builds::TemplateBuildError),
}

const ENVD_ACCESS: &str = "e2b-envd-access";
const TRAFFIC_ACCESS: &str = "e2b-traffic-access";
/// Bytes of MAC in a token (hex, twice as many characters).
const TOKEN_BYTES: usize = 20;

pub struct E2b {
    cell: ControlCell,
    /// Signs each sandbox's tokens with a key from the API token.
    signer: Signer,
    templates: templates::Templates,
    builds: template_builds::TemplateBuilds,
    processes: envd::process::Processes,
    watchers: envd::filesystem::Watchers,
    accounts: envd::users::SandboxAccounts,
    domain: Option<SandboxDomain>,
    /// Whether sandboxes' ports take requests without a token when made
    /// with E2B's `allowPublicTraffic` (its default); off, every port asks
    /// for the sandbox's traffic token (knowing an id is not enough).
    public_traffic: bool,
}

/// How the sandbox door is reached and what it lets through without a
/// token (`--e2b-domain`, `--e2b-public-traffic`).
#[derive(Debug, Clone, Default)]
pub struct SandboxDoor {
    pub domain: Option<SandboxDomain>,
    pub public_traffic: bool,
}

impl E2b {
    /// `home` holds the template aliases (`e2b-templates.toml`).
    pub fn new(
        cell: ControlCell,
        api_token: String,
        home: &Path,
        door: SandboxDoor,
    ) -> Result<Arc<E2b>, SetupError> {
        Ok(Arc::new(E2b {
            cell,
            domain: door.domain,
            public_traffic: door.public_traffic,
            signer: Signer::new(&api_token),
            templates: templates::Templates::load(home)?,
            builds: template_builds::TemplateBuilds::load(home)?,
            processes: Default::default(),
            watchers: Default::default(),
            accounts: Default::default(),
        }))
    }

    /// What `who`'s sandboxes of `template` are made of: a template built
    /// here that it reaches, an alias from the templates file, or an image
    /// by that reference (another tenant's template is none of these).
    fn template(&self, who: &Principal, template: &str) -> templates::Template {
        match self.builds.get(who, template) {
            Some(built) => built.template(),
            None => self.templates.get(template),
        }
    }

    /// The control plane, while this process runs one.
    fn control(&self) -> Option<Arc<Control>> {
        self.cell.get().cloned()
    }

    /// The sandbox's envd access token (`X-Access-Token`): a MAC of its id
    /// under the API token, so it needs no storage, survives restarts, and
    /// is worthless for any other sandbox.
    pub fn access_token(&self, sandbox_id: &str) -> String {
        self.signer
            .tag(ENVD_ACCESS, &[sandbox_id.as_bytes()], TOKEN_BYTES)
    }

    /// The sandbox's traffic token (`E2B-Traffic-Access-Token`), for its
    /// other ports: made alike, for another purpose.
    pub fn traffic_token(&self, sandbox_id: &str) -> String {
        self.signer
            .tag(TRAFFIC_ACCESS, &[sandbox_id.as_bytes()], TOKEN_BYTES)
    }

    /// Whether `token` is the sandbox's access token.
    fn token_ok(&self, sandbox_id: &str, token: &str) -> bool {
        self.signer
            .verify(ENVD_ACCESS, &[sandbox_id.as_bytes()], TOKEN_BYTES, token)
    }

    /// Whether `token` is the sandbox's traffic token.
    fn traffic_ok(&self, sandbox_id: &str, token: &str) -> bool {
        self.signer
            .verify(TRAFFIC_ACCESS, &[sandbox_id.as_bytes()], TOKEN_BYTES, token)
    }
}

/// E2B's control API (`E2B_API_URL`): sandboxes, snapshots, templates,
/// secrets and volumes, behind the API key (but for the two routes that
/// carry their own token: template file uploads and volume content).
pub fn router(e2b: Arc<E2b>) -> Router {
    Router::new()
        .route("/sandboxes", post(api::create).get(api::list))
        .route("/v2/sandboxes", post(api::create).get(api::list))
        .route("/sandboxes/{id}", get(api::detail).delete(api::kill))
        .route("/sandboxes/{id}/connect", post(api::connect))
        .route("/v2/sandboxes/{id}/connect", post(api::connect))
        .route("/sandboxes/{id}/resume", post(api::connect))
        .route("/sandboxes/{id}/timeout", post(api::set_timeout))
        .route("/sandboxes/{id}/pause", post(api::pause))
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(api::update_network),
        )
        .route("/sandboxes/{id}/metrics", get(api::metrics))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{id}", axum::routing::delete(snapshots::delete))
        .merge(template_api::routes())
        .merge(secrets::routes())
        .merge(volumes::routes())
        .route_layer(middleware::from_fn_with_state(e2b.clone(), access::gate))
        .layer(middleware::from_fn_with_state(e2b.clone(), access::auth))
        .merge(template_api::upload_route())
        .merge(volumes::content_routes())
        .with_state(e2b)
}

#[cfg(test)]
mod tests {
    use super::SandboxDomain;

    #[test]
    fn a_host_below_the_domain_names_a_sandbox_and_port() {
        let d: SandboxDomain = "Sbx.Example.com.".parse().expect("domain");
        let t = |h: &str| d.target(h);
        assert_eq!(
            t("8000-sbx-abc.sbx.example.com"),
            Some(("sbx-abc".into(), 8000))
        );
        assert_eq!(
            t("49983-sbx-abc.SBX.example.com:4443"),
            Some(("sbx-abc".into(), 49983))
        );
        for other in [
            "sbx.example.com",
            "8000-sbx-abc.example.com",
            "x-sbx-abc.sbx.example.com",
            "0-sbx-abc.sbx.example.com",
            "8000-.sbx.example.com",
            "8000-a.b.sbx.example.com",
            "8000-sbx-abc.evilsbx.example.com",
        ] {
            assert_eq!(t(other), None, "{other}");
        }
        assert!("http://x".parse::<SandboxDomain>().is_err());
        assert!("10.0.0.1".parse::<SandboxDomain>().is_err());
    }
}
