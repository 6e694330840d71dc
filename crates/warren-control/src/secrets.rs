//! Secrets as the control plane keeps them: each value sealed with the
//! server's key (XChaCha20-Poly1305, a random nonce per seal, the secret's
//! id and version bound in as associated data, so a sealed value moved to
//! another row or version does not open), opened only to hand it to the
//! node of a sandbox that names it. No read returns a value.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use warren_core::clock::now_rfc3339;
use warren_core::secret::{
    Delivery, Resolved, SecretInfo, SecretMetadata, SecretName, SecretRef, SecretRequest,
    SecretValue, MAX_PER_SANDBOX_BYTES,
};
use warren_core::tenant::{Principal, TenantName};
use warren_core::ApiError;

use crate::store::{SecretRow, Store};

/// The file under the server's home that holds the key (32 random bytes
/// as hex, mode 0600); replicas of a cluster share it, as they share the
/// API token.
pub const KEY_FILE: &str = "secrets-key";

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("secrets key {path}: {source}")]
    Key {
        path: String,
        source: std::io::Error,
    },
    #[error("secrets key {0}: expected 64 hex digits")]
    KeyShape(String),
}

/// The server's key.
#[derive(Clone)]
pub struct SecretBox {
    cipher: Arc<XChaCha20Poly1305>,
}

impl SecretBox {
    /// Reads the key from `<home>/secrets-key`, making it on first use.
    pub fn open_home(home: &Path) -> Result<SecretBox, SealError> {
        let path = home.join(KEY_FILE);
        let hex = crate::ensure_secret(&path).map_err(|source| SealError::Key {
            path: path.display().to_string(),
            source,
        })?;
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .filter_map(|i| hex.get(i..i + 2))
            .filter_map(|b| u8::from_str_radix(b, 16).ok())
            .collect();
        if bytes.len() != 32 || hex.len() != 64 {
            return Err(SealError::KeyShape(path.display().to_string()));
        }
        Ok(SecretBox {
            cipher: Arc::new(XChaCha20Poly1305::new(bytes.as_slice().into())),
        })
    }

    fn aad(id: &str, version: i64) -> String {
        format!("warren-secret:{id}:{version}")
    }

    fn seal(&self, id: &str, version: i64, value: &SecretValue) -> Result<String, ApiError> {
        let nonce: [u8; 24] = rand::random();
        let aad = Self::aad(id, version);
        let sealed = self
            .cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: value.expose().as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| ApiError::internal("sealing a secret failed"))?;
        let mut out = nonce.to_vec();
        out.extend(sealed);
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    fn unseal(&self, row: &SecretRow) -> Result<String, ApiError> {
        let cannot = || {
            ApiError::internal(format!(
                "secret {} cannot be opened with this server's key (<home>/{KEY_FILE}): \
                 every replica must hold the key the secret was sealed with",
                row.name
            ))
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&row.sealed)
            .map_err(|_| cannot())?;
        if raw.len() < 24 {
            return Err(cannot());
        }
        let (nonce, body) = raw.split_at(24);
        let nonce = XNonce::from(<[u8; 24]>::try_from(nonce).map_err(|_| cannot())?);
        let aad = Self::aad(&row.id, row.version);
        let plain = self
            .cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: body,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| cannot())?;
        String::from_utf8(plain).map_err(|_| cannot())
    }
}

fn info(row: &SecretRow) -> Result<SecretInfo, ApiError> {
    let corrupt = |what: &str| {
        ApiError::internal(format!(
            "state store: secret {} has an unreadable {what}",
            row.name
        ))
    };
    Ok(SecretInfo {
        name: SecretName::try_from(row.name.clone()).map_err(|_| corrupt("name"))?,
        id: row.id.clone(),
        version: row.version,
        metadata: serde_json::from_str(&row.metadata).map_err(|_| corrupt("metadata"))?,
        created_at: row.created_at.clone(),
        updated_at: row.updated_at.clone(),
    })
}

fn not_found(which: &str) -> ApiError {
    ApiError::not_found(format!(
        "secret {which} does not exist (see `warren secret ls`)"
    ))
}

/// The secrets service: named values sealed in the store, opened only for
/// a create that names them. No answer of it carries a value.
pub struct Secrets {
    store: Arc<dyn Store>,
    /// None: this server has no key, and every call is refused.
    sealer: Option<SecretBox>,
}

impl Secrets {
    pub(crate) fn new(store: Arc<dyn Store>, sealer: Option<SecretBox>) -> Secrets {
        Secrets { store, sealer }
    }

    fn secret_box(&self) -> Result<&SecretBox, ApiError> {
        self.sealer.as_ref().ok_or_else(|| {
            ApiError::new(
                warren_core::ErrorCode::Unavailable,
                "this server keeps no secrets (it has no key)",
            )
        })
    }

    /// The row of a secret by name or by id (`sec_…`), if any.
    async fn find(&self, which: &str) -> Result<Option<SecretRow>, ApiError> {
        let name = which.to_ascii_lowercase();
        Ok(self
            .store
            .secrets()
            .await?
            .into_iter()
            .find(|r| r.id == which || r.name == name))
    }

    /// The row of a secret by name or by id (`sec_…`).
    async fn secret_row(&self, which: &str) -> Result<SecretRow, ApiError> {
        self.find(which).await?.ok_or_else(|| not_found(which))
    }

    /// The tenant a secret belongs to, if it exists.
    pub(crate) async fn owner(&self, which: &str) -> Result<Option<TenantName>, ApiError> {
        Ok(self.find(which).await?.map(|r| r.tenant))
    }

    /// Keeps a new secret for `who`'s tenant. Names are unique across
    /// tenants (one taken answers 409 without saying whose it is).
    pub async fn create(
        &self,
        who: &Principal,
        req: SecretRequest,
    ) -> Result<SecretInfo, ApiError> {
        let tenant = crate::access::changer(who)?;
        let sealer = self.secret_box()?;
        let id = format!("sec_{}", &crate::new_secret()[..24]);
        let now = now_rfc3339();
        let row = SecretRow {
            name: req.name.to_string(),
            sealed: sealer.seal(&id, 1, &req.value)?,
            id,
            version: 1,
            metadata: serde_json::to_string(&req.metadata.unwrap_or_default())
                .map_err(|e| ApiError::internal(e.to_string()))?,
            created_at: now.clone(),
            updated_at: now,
            tenant,
        };
        match self.store.insert_secret(&row).await {
            Ok(()) => info(&row),
            Err(e) if e.is_duplicate() => Err(ApiError::conflict(format!(
                "secret {} already exists; update it with `warren secret set` (PUT /v1/secrets/{})",
                row.name, row.name
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// A new version of the value (and the metadata, when given).
    pub async fn update(
        &self,
        which: &str,
        value: SecretValue,
        metadata: Option<SecretMetadata>,
    ) -> Result<SecretInfo, ApiError> {
        let sealer = self.secret_box()?;
        let old = self.secret_row(which).await?;
        let version = old.version + 1;
        let row = SecretRow {
            sealed: sealer.seal(&old.id, version, &value)?,
            version,
            metadata: match metadata {
                Some(m) => {
                    serde_json::to_string(&m).map_err(|e| ApiError::internal(e.to_string()))?
                }
                None => old.metadata.clone(),
            },
            updated_at: now_rfc3339(),
            ..old.clone()
        };
        if !self.store.update_secret(&row, old.version).await? {
            return Err(ApiError::conflict(format!(
                "secret {} changed (or was removed) while this update ran; try again",
                old.name
            )));
        }
        info(&row)
    }

    pub async fn get(&self, which: &str) -> Result<SecretInfo, ApiError> {
        info(&self.secret_row(which).await?)
    }

    /// Every secret `who` reaches, by name.
    pub async fn list(&self, who: &Principal) -> Result<Vec<SecretInfo>, ApiError> {
        self.store
            .secrets()
            .await?
            .iter()
            .filter(|r| who.reaches(&r.tenant))
            .map(info)
            .collect()
    }

    /// Removes a secret. Sandboxes given it keep their copy; new ones that
    /// name it are refused.
    pub async fn delete(&self, which: &str) -> Result<SecretInfo, ApiError> {
        let row = self.secret_row(which).await?;
        if !self.store.delete_secret(&row.name).await? {
            return Err(not_found(which));
        }
        info(&row)
    }

    /// `tenant`'s secrets: a sandbox is given only its own tenant's.
    async fn rows_of(&self, tenant: &TenantName) -> Result<Vec<SecretRow>, ApiError> {
        let mut rows = self.store.secrets().await?;
        rows.retain(|r| &r.tenant == tenant);
        Ok(rows)
    }

    /// Refuses a spec that names a secret `tenant` does not have, before
    /// anything is made for it.
    pub(crate) async fn check(
        &self,
        refs: &[SecretRef],
        tenant: &TenantName,
    ) -> Result<(), ApiError> {
        if refs.is_empty() {
            return Ok(());
        }
        self.secret_box()?;
        let rows = self.rows_of(tenant).await?;
        match refs
            .iter()
            .find(|r| !rows.iter().any(|row| row.name == r.name.as_str()))
        {
            Some(missing) => Err(ApiError::bad_request(format!(
                "secret {} does not exist (see `warren secret ls`)",
                missing.name
            ))),
            None => Ok(()),
        }
    }

    /// The values a sandbox is given, opened now (so an update reaches the
    /// sandboxes made after it).
    pub(crate) async fn resolve(
        &self,
        refs: &[SecretRef],
        tenant: &TenantName,
    ) -> Result<Vec<Resolved>, ApiError> {
        if refs.is_empty() {
            return Ok(Vec::new());
        }
        let sealer = self.secret_box()?;
        let rows = self.rows_of(tenant).await?;
        let mut out = Vec::with_capacity(refs.len());
        let mut total = 0;
        for r in refs {
            let row = rows
                .iter()
                .find(|row| row.name == r.name.as_str())
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "secret {} does not exist (see `warren secret ls`)",
                        r.name
                    ))
                })?;
            let value = sealer.unseal(row)?;
            total += value.len();
            if total > MAX_PER_SANDBOX_BYTES {
                return Err(ApiError::bad_request(format!(
                    "the secrets given to one sandbox hold at most {MAX_PER_SANDBOX_BYTES} bytes in all"
                )));
            }
            let delivery: Delivery = r.delivery();
            out.push(Resolved { delivery, value });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_in_its_own_row_and_version() {
        let home = std::env::temp_dir().join(format!("warren-seal-{}", std::process::id()));
        std::fs::create_dir_all(&home).expect("home");
        let b = SecretBox::open_home(&home).expect("key");
        let value = SecretValue::try_from("hunter2".to_string()).expect("value");
        let row = SecretRow {
            name: "k".into(),
            id: "sec_1".into(),
            version: 1,
            metadata: "{}".into(),
            sealed: b.seal("sec_1", 1, &value).expect("seal"),
            created_at: String::new(),
            updated_at: String::new(),
            tenant: Default::default(),
        };
        assert!(!row.sealed.contains("hunter2"));
        assert_eq!(b.unseal(&row).expect("open"), "hunter2");
        let moved = SecretRow {
            version: 2,
            ..row.clone()
        };
        assert!(b.unseal(&moved).is_err());
        let other = SecretRow {
            id: "sec_2".into(),
            ..row.clone()
        };
        assert!(b.unseal(&other).is_err());
        // The same key file opens it again; another key does not.
        let again = SecretBox::open_home(&home).expect("key again");
        assert_eq!(again.unseal(&row).expect("open"), "hunter2");
        std::fs::remove_file(home.join(KEY_FILE)).expect("rm key");
        let fresh = SecretBox::open_home(&home).expect("new key");
        assert!(fresh.unseal(&row).is_err());
        let _ = std::fs::remove_dir_all(&home);
    }
}
