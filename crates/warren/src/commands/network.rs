//! `warren network`: replacing an `allowlist` sandbox's egress rules.

use anyhow::Result;

use warren_cli::client::Client;

pub(super) async fn set_rules(
    client: &Client,
    id: &str,
    allow: &[String],
    deny: &[String],
) -> Result<i32> {
    let change = client.set_network_rules(id, allow, deny).await?;
    println!("{}", serde_json::to_string_pretty(&change)?);
    Ok(0)
}
