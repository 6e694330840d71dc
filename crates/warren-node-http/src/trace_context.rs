//! A trace crosses the transport as W3C `traceparent` (and `tracestate`):
//! the client sends its current span's context on every call, and the
//! node's server opens a span for the call under it, so the node's spans
//! (exported by the node itself) join the control plane's trace. Both
//! go through OpenTelemetry's global propagator, which the daemon sets
//! only when it exports traces: otherwise nothing is sent and no span is
//! made.
//!
//! A create's phases do not rely on this: the node measures them and
//! sends them back in the create's answer ([`warren_node_api::Phases`]),
//! and the control plane draws them inside its span of the call. That
//! holds when the node exports nowhere, or to another collector, or its
//! export lags or drops spans, and whatever the node's clock says.

use axum::http::HeaderMap;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use reqwest::RequestBuilder;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// `rb` with the current span's trace context in its headers, if any.
pub(crate) fn inject(rb: RequestBuilder) -> RequestBuilder {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return rb;
    }
    let mut headers = HeaderMap::new();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(&mut headers))
    });
    rb.headers(headers)
}

/// The node's span of one call, under the caller's trace; none when the
/// call carries no trace context (the control plane's own polls and
/// heartbeats, or a control plane that does not trace).
pub(crate) fn call_span(call: &str, headers: &HeaderMap) -> tracing::Span {
    let parent =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    if !parent.span().span_context().is_valid() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "node call",
        otel.name = format!("node {call}"),
        otel.kind = "server",
        warren.call = call,
    );
    // Fails only when no OpenTelemetry layer is installed, and then no
    // span is exported anyway.
    let _ = span.set_parent(parent);
    span
}
