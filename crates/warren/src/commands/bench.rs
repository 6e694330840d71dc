use crate::{cli::BenchArgs, client::Client};
use anyhow::Result;
pub async fn run(_c: &Client, _a: BenchArgs) -> Result<i32> {
    anyhow::bail!("todo")
}
