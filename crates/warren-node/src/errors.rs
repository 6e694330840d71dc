//! The node's errors in the contract's terms: its categories and messages,
//! mapped here and nowhere else. Messages say what to do; the control
//! plane adds nothing but the HTTP status.

use warren_node_api as api;
use warren_runtime::RuntimeError;

use crate::image_calls::NoImage;
use crate::NodeError;

/// The contract's category and message for a node error.
pub fn contract_error(e: NodeError) -> api::NodeError {
    use api::NodeError as E;
    match e {
        NodeError::NotRunning(id) => E::conflict(format!(
            "sandbox {id} is not running; exec and files need a running sandbox (see `warren inspect {id}`)"
        )),
        NodeError::BadRequest(m) => E::invalid(m),
        NodeError::Conflict(m) => E::conflict(m),
        NodeError::NotFound(m) | NodeError::Runtime(RuntimeError::NotFound(m)) => {
            E::not_found(m)
        }
        NodeError::NoRoom(m) | NodeError::Runtime(RuntimeError::NoRoom(m)) => {
            E::new(api::ErrorKind::NoRoom, m)
        }
        NodeError::NoImage { image, why } => missing_image(&image, *why),
        NodeError::Runtime(RuntimeError::BadPath(m)) => E::invalid(format!("invalid path {m}")),
        NodeError::Runtime(RuntimeError::Exists(m)) => E::conflict(m),
        NodeError::Runtime(RuntimeError::BadImage(m) | RuntimeError::Unsupported(m)) => {
            E::invalid(m)
        }
        NodeError::Runtime(RuntimeError::Unresponsive(m)) => E::unavailable(m),
        NodeError::Image(e) => image_error(e),
        NodeError::Net(e @ (warren_net::NetError::Rule(_) | warren_net::NetError::OpenOff)) => {
            E::invalid(e.to_string())
        }
        other => E::internal(other.to_string()),
    }
}

/// A create's image this node lacks, in the words that say where to get it.
fn missing_image(image: &str, why: NoImage) -> api::NodeError {
    match why {
        NoImage::Local(e) => {
            let mut e = contract_error(e);
            e.message = format!(
                "{} (image {image:?} is local to each node: import it through the control plane, which imports it on every node, or give the server a --cluster-registry to publish local images to)",
                e.message
            );
            e
        }
        NoImage::Pull { pinned, error } => {
            let mut e = contract_error(error);
            e.message = format!(
                "this node lacks the image and pulling {pinned} failed: {}",
                e.message
            );
            e
        }
        NoImage::Unusable(e) => contract_error(e),
    }
}

fn image_error(e: warren_image::ImageError) -> api::NodeError {
    use api::NodeError as E;
    use warren_image::{ErrorKind, ImageError};
    match e.kind() {
        ErrorKind::NotFound if matches!(e, ImageError::RemoteNotFound(_)) => {
            E::not_found(e.to_string())
        }
        ErrorKind::NotFound => E::not_found(format!(
            "{e}; import it with `warren image import FILE.tar --name NAME:TAG` (see `warren image ls`)"
        )),
        ErrorKind::Invalid => E::invalid(e.to_string()),
        ErrorKind::Conflict => E::conflict(e.to_string()),
        ErrorKind::Internal => E::internal(e.to_string()),
        ErrorKind::Upstream => E::new(api::ErrorKind::Upstream, e.to_string()),
    }
}

/// A volume call's error: the runtime's file functions speak of
/// sandboxes, so their words are turned to the volume's.
pub(crate) fn volume_error(e: RuntimeError) -> api::NodeError {
    let mut e = contract_error(e.into());
    e.message = e.message.replace("sandbox", "volume");
    e
}
