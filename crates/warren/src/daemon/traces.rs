//! Traces over OTLP/HTTP (docs/observability.md). Warren's spans are
//! `tracing` spans (and, for a create's node phases, spans the control
//! plane makes from the node's timings); with an endpoint set they go
//! through `tracing-opentelemetry` to OpenTelemetry's SDK and its OTLP
//! exporter. Without one nothing is built: no exporter thread, no
//! propagator (so no `traceparent` on node calls), no span is recorded.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::cli::TraceOpts;

/// What an export sends (`OTEL_EXPORTER_OTLP_PROTOCOL`). JSON by default,
/// not the standard's protobuf: every OTLP/HTTP receiver (the collector,
/// Jaeger, Tempo) takes both, and JSON can be read by a person or a test
/// without the protocol's schema.
fn protocol() -> Result<Protocol> {
    match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").ok().as_deref() {
        None | Some("") | Some("http/json") => Ok(Protocol::HttpJson),
        Some("http/protobuf") => Ok(Protocol::HttpBinary),
        Some(other) => bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other}: Warren exports OTLP over HTTP, as http/json (the default) or http/protobuf; point it at the collector's HTTP port (4318)"
        ),
    }
}

/// The traces' URL under a collector's base URL.
fn traces_url(base: &str) -> Result<String> {
    let base = base.trim();
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        bail!("--otlp-endpoint {base:?}: an http:// or https:// URL (the collector's OTLP/HTTP port, e.g. http://127.0.0.1:4318)");
    }
    Ok(format!("{}/v1/traces", base.trim_end_matches('/')))
}

/// A daemon's trace export, flushed when dropped (at the daemon's end).
pub struct Exporting {
    provider: SdkTracerProvider,
}

impl Drop for Exporting {
    fn drop(&mut self) {
        // The batch processor's last export blocks until it is sent or
        // times out: on a thread of its own, as a tokio worker may not
        // block (and the exporter's blocking HTTP client may not be used
        // from inside a runtime).
        let provider = self.provider.clone();
        let flushed = std::thread::Builder::new()
            .name("otlp-flush".into())
            .spawn(move || provider.shutdown())
            .map(|t| t.join());
        match flushed {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "sending the last traces"),
            Ok(Err(_)) => tracing::warn!("sending the last traces: the flush panicked"),
            Err(e) => tracing::warn!(error = %e, "sending the last traces: no thread for it"),
        }
    }
}

/// The layer that turns Warren's spans into exported ones, and what
/// flushes them, when an endpoint is set; `service` names the daemon
/// unless `OTEL_SERVICE_NAME` does.
pub fn layer<S>(
    opts: &TraceOpts,
    service: &str,
) -> Result<Option<(impl Layer<S> + Send + Sync + 'static, Exporting)>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let Some(base) = opts
        .otlp_endpoint
        .as_deref()
        .filter(|b| !b.trim().is_empty())
    else {
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol()?)
        .with_endpoint(traces_url(base)?)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .context("the OTLP trace exporter")?;
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| service.to_string());
    // The batch processor: spans are queued (bounded, 2048 by default;
    // past it they are dropped, never waited for) and sent from a thread
    // of its own every 5 s or 512 spans, so a create never waits on the
    // collector. OTEL_BSP_* tune it.
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    // The control plane makes the spans of a node's phases through the
    // global provider, and the node transport carries `traceparent`
    // through the global propagator: both are no-ops until set here.
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("warren"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        // Warren's own spans only (not its libraries'), and no events:
        // log lines stay in the daemon's log.
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.is_span()
                && *meta.level() <= tracing::Level::INFO
                && meta.target().starts_with("warren")
        }));
    Ok(Some((layer, Exporting { provider })))
}

/// How long one export may take before it is given up (the batch is
/// dropped; the next one is tried).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_goes_under_the_base_url() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/prefix").unwrap(),
            "https://otel.example/prefix/v1/traces"
        );
        assert!(traces_url("127.0.0.1:4318").is_err());
    }
}
