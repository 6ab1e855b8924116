//! HTTP admin API: `/health` (open), and with `Authorization: Bearer <cluster secret>`:
//! `/status` (JSON), `/table` (JSON), `/metrics` (Prometheus text format), `/history` (JSON:
//! memory allocated and used over time, with its integrals; `tessera report` plots it).
//!
//! Served by hyper directly rather than `axum::serve`, which has no timeouts: a connection
//! must send each request's headers within `HTTP_IDLE_TIMEOUT` of its start or of the answer
//! before, and the port holds at most `HTTP_MAX_CONNECTIONS` (past it the oldest is closed),
//! so idle or half-sent connections cannot exhaust the manager's file descriptors.

use crate::history::{usage_stats, Sample};
use crate::Shared;
use axum::extract::{Request, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_proto::admit::Admission;
use tessera_proto::RateLimit;
use tokio::net::TcpListener;
use tracing::{debug, warn};

/// HTTP connections the manager holds at once; past it, the oldest is closed to make room.
pub const HTTP_MAX_CONNECTIONS: usize = 256;
/// How long an HTTP connection may take to send a request's headers, counted from its start
/// or from the answer before (so also how long it may stay idle).
pub const HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Ctx {
    shared: Arc<Shared>,
    token: Arc<str>,
}

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, token: String) {
    let ctx = Ctx {
        shared,
        token: token.into(),
    };
    let protected = Router::new()
        .route("/status", get(status))
        .route("/table", get(table))
        .route("/metrics", get(metrics))
        .route("/history", get(history))
        .route_layer(axum::middleware::from_fn_with_state(
            ctx.clone(),
            require_token,
        ));
    let app = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .merge(protected)
        .with_state(ctx);
    static ACCEPT_FAILED: RateLimit = RateLimit::new("failed HTTP accepts");
    static CROWDED: RateLimit = RateLimit::new("HTTP connections closed to make room");
    let open = Admission::new(HTTP_MAX_CONNECTIONS);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HTTP_IDLE_TIMEOUT);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Typically EMFILE: back off instead of spinning.
                if ACCEPT_FAILED.hit() {
                    warn!("HTTP accept failed: {e}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (mut ticket, evicted) = open.admit();
        if evicted && CROWDED.hit() {
            warn!(%peer, "over {HTTP_MAX_CONNECTIONS} HTTP connections: closing the oldest");
        }
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        tokio::spawn(async move {
            if let Some(Err(e)) = ticket.run(conn).await {
                debug!(%peer, "HTTP connection ended: {e}");
            }
        });
    }
}

async fn require_token(
    AxState(ctx): AxState<Ctx>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compare digests so the time taken says nothing about the token.
    if given.is_some_and(|g| blake3::hash(g.as_bytes()) == blake3::hash(ctx.token.as_bytes())) {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            "send the cluster secret as 'Authorization: Bearer <secret>'\n",
        )
            .into_response()
    }
}

async fn status(AxState(ctx): AxState<Ctx>) -> Response {
    let status = ctx.shared.lock().status(Instant::now());
    let nodes: Vec<_> = status
        .nodes
        .iter()
        .map(|n| {
            let pct = if n.stats.capacity == 0 {
                0.0
            } else {
                100.0 * n.stats.used as f64 / n.stats.capacity as f64
            };
            json!({"node": n, "memory_used_percent": pct})
        })
        .collect();
    Json(json!({"status": status, "nodes": nodes})).into_response()
}

async fn table(AxState(ctx): AxState<Ctx>) -> Response {
    let st = ctx.shared.lock();
    match st.table() {
        Some(t) => {
            let tb = &t.table;
            let changed: Vec<_> = (0..tb.partitions()).map(|p| tb.changed(p)).collect();
            Json(json!({
                "epoch": tb.epoch(),
                "partitions": tb.partitions(),
                "config": t.config,
                "nodes": t.nodes,
                "replicas": tb.all(),
                "incoming": tb.all_incoming(),
                "changed": changed,
                "goal": st.goal(),
                "degraded": tb.degraded(t.config.replication).collect::<Vec<_>>(),
                "lost": tb.lost().collect::<Vec<_>>(),
            }))
            .into_response()
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no partition table yet: waiting for servers\n",
        )
            .into_response(),
    }
}

/// The body of `/history`: the samples (a step function: each holds until the next), the
/// current bucket width, and the integrals over the whole record.
pub(crate) fn history_body(samples: &[Sample], resolution_ms: u64) -> serde_json::Value {
    json!({
        "resolution_ms": resolution_ms,
        "samples": samples,
        "stats": usage_stats(samples),
    })
}

async fn history(AxState(ctx): AxState<Ctx>) -> Response {
    // Copy out under the lock (a few thousand samples at most), encode outside it.
    let (samples, resolution) = {
        let st = ctx.shared.lock();
        let h = st.history();
        (h.samples(), h.resolution_ms())
    };
    Json(history_body(&samples, resolution)).into_response()
}

type Labels = Vec<(String, String)>;

async fn metrics(AxState(ctx): AxState<Ctx>) -> Response {
    let status = ctx.shared.lock().status(Instant::now());
    let mut reg = Registry::with_prefix("tessera");
    let epoch = Gauge::<i64>::default();
    epoch.set(status.epoch.unwrap_or(0) as i64);
    reg.register("epoch", "Partition table epoch (0: no table yet)", epoch);
    let parts = Family::<Labels, Gauge>::default();
    for (state, v) in [("degraded", status.degraded), ("lost", status.lost)] {
        parts
            .get_or_create(&vec![("state".into(), state.into())])
            .set(i64::from(v));
    }
    reg.register(
        "partitions",
        "Partitions with fewer complete copies than the replication factor (degraded) or none \
         (lost)",
        parts,
    );
    let incoming = Gauge::<i64>::default();
    incoming.set(i64::from(status.incoming));
    reg.register(
        "partition_copies_incoming",
        "Partition copies being received (rebuilds and migrations)",
        incoming,
    );
    let nodes = Family::<Labels, Gauge>::default();
    let alive = status.nodes.iter().filter(|n| n.alive).count() as i64;
    nodes
        .get_or_create(&vec![("state".into(), "alive".into())])
        .set(alive);
    nodes
        .get_or_create(&vec![("state".into(), "dead".into())])
        .set(status.nodes.len() as i64 - alive);
    reg.register("nodes", "Storage servers by state", nodes);

    let used = Family::<Labels, Gauge>::default();
    let capacity = Family::<Labels, Gauge>::default();
    let partitions = Family::<Labels, Gauge>::default();
    let load = Family::<Labels, Gauge>::default();
    let read = Family::<Labels, Counter>::default();
    let written = Family::<Labels, Counter>::default();
    let ops = Family::<Labels, Counter>::default();
    let syncing = Family::<Labels, Gauge>::default();
    let synced = Family::<Labels, Counter>::default();
    for n in &status.nodes {
        let l: Labels = vec![("node".into(), n.id.to_string())];
        used.get_or_create(&l).set(n.stats.used as i64);
        capacity.get_or_create(&l).set(n.stats.capacity as i64);
        partitions.get_or_create(&l).set(i64::from(n.partitions));
        load.get_or_create(&l).set(i64::from(n.stats.load));
        read.get_or_create(&l).inc_by(n.stats.bytes_read);
        written.get_or_create(&l).inc_by(n.stats.bytes_written);
        syncing.get_or_create(&l).set(i64::from(n.stats.syncing));
        synced.get_or_create(&l).inc_by(n.stats.synced_bytes);
        for (op, v) in [
            ("read", n.stats.reads),
            ("write", n.stats.writes),
            ("meta", n.stats.meta_ops),
        ] {
            let mut lo = l.clone();
            lo.push(("op".into(), op.into()));
            ops.get_or_create(&lo).inc_by(v);
        }
    }
    reg.register(
        "node_memory_used_bytes",
        "Memory holding stripes and metadata",
        used,
    );
    reg.register(
        "node_memory_capacity_bytes",
        "Memory the server offers",
        capacity,
    );
    reg.register("node_partitions", "Partition copies held", partitions);
    reg.register("node_load", "Requests being served", load);
    reg.register("node_read_bytes", "Bytes read from the node", read);
    reg.register("node_written_bytes", "Bytes written to the node", written);
    reg.register("node_ops", "Operations served by kind", ops);
    reg.register(
        "node_syncing_partitions",
        "Partition copies the node is receiving",
        syncing,
    );
    reg.register(
        "node_synced_bytes",
        "Bytes the node received by partition syncs",
        synced,
    );
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &reg) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        )
            .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;

    #[test]
    fn history_body_has_samples_and_stats() {
        let empty = history_body(&[], 1000);
        assert_eq!(empty["samples"], json!([]));
        assert_eq!(empty["stats"]["duration_s"], 0.0);
        let mut h = History::new(16, 0);
        for (t, used) in [(0, 1u64 << 30), (2000, 2 << 30), (4000, 2 << 30)] {
            h.record(Sample {
                t_ms: t,
                nodes: 2,
                allocated: 4 << 30,
                used,
            });
        }
        let v = history_body(&h.samples(), h.resolution_ms());
        assert_eq!(v["resolution_ms"], 0);
        assert_eq!(v["samples"].as_array().map(Vec::len), Some(3));
        assert_eq!(v["samples"][1]["used"], 2u64 << 30);
        assert_eq!(v["stats"]["duration_s"], 4.0);
        assert_eq!(v["stats"]["mean_utilisation"], 0.375);
        assert_eq!(v["stats"]["peak_nodes"], 2);
    }
}
