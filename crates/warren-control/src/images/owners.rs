//! Who owns each image name. Images live on the nodes; the control plane
//! keeps their owners (the store's `owners` table). A name a tenant made
//! (built, committed, imported or pulled into a name of its own) is that
//! tenant's: another tenant neither sees, runs, builds on nor removes it,
//! and it answers to them as no image at all. A name without an owner is
//! shared: the operator's, which every tenant may run and build on but
//! only the operator changes. The operator reaches every image.

use std::collections::HashMap;

use warren_core::image_ref::with_tag;
use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, ErrorCode};
use warren_node_api::{ImageInfo, NodeError};

use crate::images::Images;
use crate::store::OwnedName::Image;

/// The answer for another tenant's image: the words a missing one gets.
fn no_image(name: &str) -> String {
    format!("image {name} not found (see `warren image ls`)")
}

/// The answer for a name another tenant owns, to a tenant that would make
/// or pull an image into it.
fn taken(name: &str) -> ApiError {
    ApiError::conflict(format!("the image name {name} is taken; choose another"))
}

impl Images {
    /// Every owned image name's owner.
    async fn owners(&self) -> Result<HashMap<String, TenantName>, ApiError> {
        Ok(self.store.owners(Image).await?.into_iter().collect())
    }

    /// The owner of image name `name` (tagged), if it has one.
    async fn owner(&self, name: &str) -> Result<Option<TenantName>, ApiError> {
        Ok(self.store.owner(Image, &with_tag(name)).await?)
    }

    /// Refuses a create (or a build's `FROM`) of `tenant`'s whose image,
    /// by the reference it gave or the name it resolved to, another tenant
    /// owns: as the node refuses a missing image.
    pub(crate) async fn check_use(
        &self,
        tenant: &TenantName,
        reference: &str,
        image: &ImageInfo,
    ) -> Result<(), NodeError> {
        if tenant.is_default() {
            return Ok(());
        }
        let mut names = vec![with_tag(reference)];
        if with_tag(&image.name) != names[0] {
            names.push(with_tag(&image.name));
        }
        for name in names {
            let owner = self
                .owner(&name)
                .await
                .map_err(|e| NodeError::internal(e.message))?;
            if owner.is_some_and(|o| o != *tenant) {
                return Err(NodeError::not_found(no_image(reference)));
            }
        }
        Ok(())
    }

    /// Before `who` makes an image named `name` (a build's tag, a commit,
    /// an import): a tenant may only make a name that is its own
    /// already or that no image has, and it is then its own. The operator
    /// may make any; what it makes is shared unless a tenant owns the name.
    pub(crate) async fn claim(&self, who: &Principal, name: &str) -> Result<(), ApiError> {
        let tenant = crate::access::changer(who)?;
        if tenant.is_default() {
            return Ok(());
        }
        let name = with_tag(name);
        match self.owner(&name).await? {
            Some(owner) if owner == tenant => return Ok(()),
            Some(_) => return Err(taken(&name)),
            None => {}
        }
        let exists = self.list_all().await?.iter().any(|i| i.name == name);
        if exists {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "{name} is a shared image (the operator's): a tenant may run and build on it, not replace it; name yours, e.g. {tenant}/{name}"
                ),
            ));
        }
        self.store.put_owner(Image, &name, &tenant).await?;
        Ok(())
    }

    /// Before `who` pulls `reference`: a registry's image is anyone's to
    /// pull (it stays shared), but not into a name another tenant owns.
    pub(crate) async fn may_pull(&self, who: &Principal, reference: &str) -> Result<(), ApiError> {
        let tenant = crate::access::changer(who)?;
        match self.owner(reference).await? {
            Some(owner) if !tenant.is_default() && owner != tenant => Err(taken(reference)),
            _ => Ok(()),
        }
    }

    /// The images `who` reaches on every reachable node.
    pub async fn list(&self, who: &Principal) -> Result<Vec<ImageInfo>, ApiError> {
        let owners = self.owners().await?;
        let reaches = |i: &ImageInfo| owners.get(&i.name).is_none_or(|o| who.reaches(o));
        Ok(self.list_all().await?.into_iter().filter(reaches).collect())
    }

    /// Removes `who`'s image `reference` from every reachable node: a
    /// tenant removes only names of its own.
    pub async fn remove(&self, who: &Principal, reference: &str) -> Result<ImageInfo, ApiError> {
        let tenant = crate::access::changer(who)?;
        let name = with_tag(reference);
        let owner = self.owner(&name).await?;
        match &owner {
            _ if tenant.is_default() => {}
            Some(o) if *o == tenant => {}
            Some(_) => return Err(ApiError::not_found(no_image(reference))),
            None => {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!("{reference} is not an image of tenant {tenant}'s: a tenant removes only the images it made, by name (see `warren image ls`)"),
                ))
            }
        }
        let removed = self.remove_everywhere(reference).await?;
        if owner.is_some() {
            self.store.delete_owner(Image, &name).await?;
        }
        Ok(removed)
    }
}
