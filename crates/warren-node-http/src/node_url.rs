//! A node's address as the control plane is given it, checked once when
//! it is read: `http://host:port` or `https://host:port` (with a path prefix
//! the node's API is mounted under, if any), no user or password.

use std::str::FromStr;
use std::sync::Arc;

use reqwest::Url;
use warren_node_api::NodeError;

use crate::wire::PREFIX;

/// A usable node URL: the node API's root (`…/node/v2`) and the URL as
/// written, for messages.
#[derive(Debug, Clone)]
pub(crate) struct NodeUrl {
    pub(crate) api: Url,
    pub(crate) shown: Arc<str>,
}

impl NodeUrl {
    /// Whether the node serves its API over TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.api.scheme() == "https"
    }
}

impl FromStr for NodeUrl {
    type Err = NodeError;

    fn from_str(written: &str) -> Result<NodeUrl, NodeError> {
        let bad = |why: &str| NodeError::invalid(format!("node URL {written:?}: {why}"));
        let mut api = Url::parse(written).map_err(|e| bad(&e.to_string()))?;
        if !matches!(api.scheme(), "http" | "https") {
            return Err(bad(&format!(
                "scheme {:?} is not http or https",
                api.scheme()
            )));
        }
        if api.host().is_none() {
            return Err(bad("it has no host"));
        }
        if !api.username().is_empty() || api.password().is_some() {
            // It would be shown in messages, and the node takes only its
            // credential anyway.
            return Err(bad(
                "it takes no user or password: pass the node credential on its own",
            ));
        }
        api.set_query(None);
        api.set_fragment(None);
        api.path_segments_mut()
            .map_err(|()| bad("it cannot take a path"))?
            .pop_if_empty()
            .extend(PREFIX);
        Ok(NodeUrl {
            api,
            shown: written.trim_end_matches('/').into(),
        })
    }
}
