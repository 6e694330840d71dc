//! A small typed client for the HTTP API, used by every client command and
//! by the benchmark.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use warren_core::{ErrorBody, ExecEvent, ExecRequest, SandboxInfo, SandboxSpec};

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    pub fn new(url: &str, token: Option<String>, home: &Path) -> Result<Client> {
        let token = match token {
            Some(t) => t,
            None => std::fs::read_to_string(home.join("token"))
                .map(|t| t.trim().to_string())
                .with_context(|| {
                    format!(
                        "no API token: set WARREN_TOKEN or make {} readable (is `warren up --home {}` running?)",
                        home.join("token").display(),
                        home.display()
                    )
                })?,
        };
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .build()
            .context("HTTP client")?;
        Ok(Client {
            http,
            base: url.trim_end_matches('/').to_string(),
            token,
        })
    }

    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.token)
    }

    /// Sends and turns an API error body into an error with its message.
    pub async fn send(&self, req: RequestBuilder) -> Result<Response> {
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach Warren at {}", self.base))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => bail!("{} ({})", body.error.message, status),
            Err(_) => bail!("{status}: {text}"),
        }
    }

    pub async fn json<T: DeserializeOwned>(&self, req: RequestBuilder) -> Result<T> {
        let resp = self.send(req).await?;
        resp.json().await.context("decoding the API response")
    }

    pub async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        self.json(self.request(Method::POST, "/v1/sandboxes").json(spec))
            .await
    }

    pub async fn get(&self, id: &str) -> Result<SandboxInfo> {
        self.json(self.request(Method::GET, &format!("/v1/sandboxes/{id}")))
            .await
    }

    pub async fn delete(&self, id: &str) -> Result<SandboxInfo> {
        self.json(self.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
            .await
    }

    /// Starts an exec and calls `on_event` for each event; returns the exit event.
    pub async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
        mut on_event: impl FnMut(&ExecEvent),
    ) -> Result<ExecEvent> {
        let resp = self
            .send(
                self.request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(req),
            )
            .await?;
        let mut lines = LineStream::new(resp);
        while let Some(line) = lines.next_line().await? {
            let ev: ExecEvent = serde_json::from_slice(&line).context("decoding an exec event")?;
            on_event(&ev);
            match ev {
                ExecEvent::Exit { .. } => return Ok(ev),
                ExecEvent::Error { message } => bail!("exec failed: {message}"),
                _ => {}
            }
        }
        Err(anyhow!(
            "the exec stream ended without an exit event (sandbox destroyed?)"
        ))
    }
}

/// Splits a streamed response body into lines.
pub struct LineStream {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: Vec<u8>,
    done: bool,
}

impl LineStream {
    pub fn new(resp: Response) -> LineStream {
        LineStream {
            body: Box::pin(resp.bytes_stream()),
            buf: Vec::new(),
            done: false,
        }
    }

    pub async fn next_line(&mut self) -> Result<Option<Vec<u8>>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.done {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            match self.body.next().await {
                Some(chunk) => self
                    .buf
                    .extend_from_slice(&chunk.context("reading the response stream")?),
                None => self.done = true,
            }
        }
    }
}
