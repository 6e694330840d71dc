//! What the control plane's spans say (docs/observability.md): the
//! sandbox they are about (`warren.sandbox.id`, `warren.tenant`,
//! `warren.node`, each label as `warren.label.KEY`), how they ended, and
//! a create's phases on its node. The spans themselves are `tracing`
//! spans where the work is; these attributes reach them only when the
//! daemon exports traces (without an OpenTelemetry layer every call here
//! returns at its first check).

use std::time::{Duration, SystemTime};

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use opentelemetry::trace::{Status, TraceContextExt, Tracer};
use opentelemetry::Context;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use warren_core::tenant::TenantName;
use warren_core::{ApiError, ExecEvent, Labels};
use warren_node_api::PhaseTiming;

use crate::store::SandboxRow;

/// The span's OpenTelemetry context, when it is exported.
fn traced(span: &Span) -> Option<Context> {
    let cx = span.context();
    cx.span().span_context().is_valid().then_some(cx)
}

/// Who a sandbox belongs to and what it is labelled with.
pub(crate) fn owner(span: &Span, tenant: &TenantName, labels: &Labels) {
    if traced(span).is_none() {
        return;
    }
    span.set_attribute("warren.tenant", tenant.to_string());
    for (key, value) in labels {
        span.set_attribute(format!("warren.label.{key}"), value.clone());
    }
}

/// The sandbox a span is about, once it has an id.
pub(crate) fn sandbox_id(span: &Span, id: &str) {
    if traced(span).is_some() {
        span.set_attribute("warren.sandbox.id", id.to_string());
    }
}

/// The node a span's sandbox is (or goes) on.
pub(crate) fn node(span: &Span, node: &str) {
    if traced(span).is_some() && !node.is_empty() {
        span.set_attribute("warren.node", node.to_string());
    }
}

/// Everything [`owner`], [`sandbox_id`] and [`node`] say, from a record.
pub(crate) fn sandbox(span: &Span, row: &SandboxRow) {
    sandbox_id(span, &row.id);
    owner(span, &row.tenant, &row.spec.labels);
    node(span, &row.node);
}

/// Marks the span failed with `message`.
pub(crate) fn failed(span: &Span, message: &str) {
    if traced(span).is_some() {
        span.set_status(Status::error(message.to_string()));
    }
}

/// Marks the span failed when `result` is an error.
pub(crate) fn outcome<T>(span: &Span, result: &Result<T, ApiError>) {
    if let Err(e) = result {
        failed(span, &e.message);
    }
}

/// An exec's events, in `span` until they end (or are dropped): its exit
/// code, signal and timeout, or its error, are recorded as they pass.
pub(crate) fn exec_events(
    span: Span,
    events: BoxStream<'static, ExecEvent>,
) -> BoxStream<'static, ExecEvent> {
    if traced(&span).is_none() {
        return events;
    }
    events
        .inspect(move |event| match event {
            ExecEvent::Exit {
                code,
                signal,
                timed_out,
                ..
            } => {
                span.record("warren.exec.exit_code", code);
                if let Some(signal) = signal {
                    span.record("warren.exec.signal", signal);
                }
                span.record("warren.exec.timed_out", timed_out);
            }
            ExecEvent::Error { message } => failed(&span, message),
            _ => {}
        })
        .boxed()
}

/// Draws a create's phases on its node as spans under `call`, the control
/// plane's span of the node's create, which began at `began` and took
/// `took`. The node measured them against its own start of the create;
/// that start is put where the request's trip and the answer's would be
/// equal, so the phases fit inside `call` whatever the node's clock says.
/// A phase that lies inside an earlier one (the spawner's, inside
/// `runtime_spawn`) is drawn as its child.
pub(crate) fn node_phases(call: &Span, began: SystemTime, took: Duration, phases: &[PhaseTiming]) {
    let Some(parent) = traced(call) else {
        return;
    };
    let placed = place(phases);
    let on_node = placed.iter().map(|p| p.1 + p.2).max().unwrap_or(0);
    let slack = micros(took).saturating_sub(on_node) / 2;
    let at = |offset: u64| began + Duration::from_micros(slack + offset);
    let tracer = opentelemetry::global::tracer("warren");
    // The phases that may still hold the next one: (its end, its context).
    let mut open: Vec<(u64, Context)> = Vec::new();
    for (name, start, length) in placed {
        let end = start + length;
        while open.last().is_some_and(|(until, _)| *until < end) {
            open.pop();
        }
        let under = open.last().map_or(&parent, |(_, cx)| cx);
        let span = tracer
            .span_builder(name.to_string())
            .with_start_time(at(start))
            .start_with_context(&tracer, under);
        let cx = under.with_span(span);
        cx.span().end_with_timestamp(at(end));
        open.push((end, cx));
    }
}

/// Each phase as (name, start, length) in microseconds after the node's
/// start of the create; a node that gave no start is read as running its
/// phases end to end.
fn place(phases: &[PhaseTiming]) -> Vec<(&str, u64, u64)> {
    let mut next = 0;
    phases
        .iter()
        .map(|p| {
            let start = p.start_micros.unwrap_or(next);
            next = start + p.micros;
            (p.phase.as_str(), start, p.micros)
        })
        .collect()
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, start: Option<u64>, micros: u64) -> PhaseTiming {
        PhaseTiming {
            phase: name.into(),
            micros,
            start_micros: start,
        }
    }

    #[test]
    fn phases_keep_the_node_s_starts_or_run_end_to_end() {
        let given = [
            phase("a", Some(5), 10),
            phase("b", Some(20), 30),
            phase("b1", Some(22), 4),
        ];
        assert_eq!(
            place(&given),
            vec![("a", 5, 10), ("b", 20, 30), ("b1", 22, 4)]
        );
        let old = [phase("a", None, 10), phase("b", None, 3)];
        assert_eq!(place(&old), vec![("a", 0, 10), ("b", 10, 3)]);
    }
}
