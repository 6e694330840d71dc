//! Capabilities signed with a key derived from the API token: they need no
//! storage, hold on every replica (they share the token) and across
//! restarts, and each is worthless for anything but what it names. The E2B
//! door's access tokens and the links to a sandbox's ports are made here.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The key: an HMAC-SHA256 keyed by the API token, fed a purpose and the
/// fields of what it signs.
#[derive(Clone)]
pub struct Signer {
    mac: Hmac<Sha256>,
}

impl Signer {
    pub fn new(api_token: &str) -> Signer {
        Signer {
            // HMAC takes a key of any length, so this cannot fail.
            mac: <Hmac<Sha256> as KeyInit>::new_from_slice(api_token.as_bytes())
                .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length")),
        }
    }

    /// The tag (hex, `len` bytes of it) of `fields` for `purpose`; each
    /// field is length-prefixed, so no two lists of fields sign alike.
    pub fn tag(&self, purpose: &str, fields: &[&[u8]], len: usize) -> String {
        let mut mac = self.mac.clone();
        mac.update(purpose.as_bytes());
        mac.update(b":");
        for f in fields {
            mac.update(&(f.len() as u64).to_be_bytes());
            mac.update(f);
        }
        let tag = mac.finalize().into_bytes();
        hex::encode(&tag[..len.min(tag.len())])
    }

    /// Whether `given` is the tag of `fields` for `purpose`, compared in
    /// constant time.
    pub fn verify(&self, purpose: &str, fields: &[&[u8]], len: usize, given: &str) -> bool {
        self.tag(purpose, fields, len)
            .as_bytes()
            .ct_eq(given.as_bytes())
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_names_its_purpose_fields_and_key() {
        let s = Signer::new("token-a");
        let t = s.tag("port", &[b"sbx-1", b"80"], 16);
        assert_eq!(t.len(), 32);
        assert!(s.verify("port", &[b"sbx-1", b"80"], 16, &t));
        assert!(!s.verify("port", &[b"sbx-1", b"81"], 16, &t));
        assert!(!s.verify("other", &[b"sbx-1", b"80"], 16, &t));
        // Field boundaries count: ("sbx-18", "0") is not ("sbx-1", "80").
        assert!(!s.verify("port", &[b"sbx-18", b"0"], 16, &t));
        assert!(!Signer::new("token-b").verify("port", &[b"sbx-1", b"80"], 16, &t));
        assert!(!s.verify("port", &[b"sbx-1", b"80"], 16, ""));
    }
}
