//! The receiving side of a partition copy: for every partition the table says this node receives, pull it from the partition's
//! primary while the partition keeps serving: a snapshot, then the changes since the previous
//! round, until a round is small; then one last round with the partition fenced (changes to
//! it alone wait, for the length of that round and of the table update), and tell the
//! manager, which makes this copy a replica in the next table epoch.
//!
//! Copies are throttled (`sync_rate` bytes per second per node) so foreground I/O goes on.

use super::{Host, FENCE_TIMEOUT};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tessera_placement::{NodeId, PartitionId};
use tessera_proto::{ErrorCode, Op, Request, Response};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Partitions received at once.
const PARALLEL: usize = 2;
/// A round with fewer changes than this is followed by the fenced last round.
const SMALL_ROUND: usize = 64;
/// At most this many unfenced rounds: a partition written faster than it copies is fenced
/// after them anyway.
const MAX_ROUNDS: u32 = 6;
/// A pull answered "stale" (source and receiver on different epochs) is asked again after a
/// pause, this many times at most.
const STALE_RETRIES: u32 = 400;
const STALE_PAUSE: Duration = Duration::from_millis(5);
/// A copy reported complete asks for the table this often until it shows the promotion.
const PROMOTION_POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("the table moved on: {0}")]
    Moved(String),
    #[error("{0}")]
    Failed(String),
}

/// Runs forever: starts the copies the current table asks of this node.
pub async fn run(h: Arc<impl Host>, manager: SocketAddr, rate: u64) {
    let active: Arc<Mutex<HashSet<PartitionId>>> = Arc::default();
    // Each copy task sends one message, and at most `PARALLEL` tasks run (a partition leaves
    // `active` only once its message is received): the channel never holds more, and a send
    // never waits.
    let (tx, mut finished) = tokio::sync::mpsc::channel::<(PartitionId, bool)>(PARALLEL);
    loop {
        let woken = h.installed().notified();
        if let Some(t) = h.table() {
            let table = &t.info.table;
            let mut act = active.lock().unwrap_or_else(PoisonError::into_inner);
            for p in 0..table.partitions() {
                if act.len() >= PARALLEL {
                    break;
                }
                if !table.receives(h.id(), p) || act.contains(&p) {
                    continue;
                }
                act.insert(p);
                let (h, tx) = (h.clone(), tx.clone());
                tokio::spawn(async move {
                    h.copies().syncing.fetch_add(1, Ordering::Relaxed);
                    let ok = match copy(&*h, p, manager, rate / PARALLEL as u64).await {
                        Ok(()) => true,
                        Err(e) => {
                            warn!(partition = p, "copy abandoned: {e}");
                            false
                        }
                    };
                    h.copies().syncing.fetch_sub(1, Ordering::Relaxed);
                    let _ = tx.send((p, ok)).await;
                });
            }
        }
        tokio::select! {
            biased;
            () = woken => {}
            Some((p, ok)) = finished.recv() => {
                active.lock().unwrap_or_else(PoisonError::into_inner).remove(&p);
                if !ok {
                    // Retried on a later table or after a pause, from scratch.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Copies partition `p` from its primary, then reports it to the manager.
async fn copy(
    h: &impl Host,
    p: PartitionId,
    manager: SocketAddr,
    rate: u64,
) -> Result<(), SyncError> {
    let t = h
        .table()
        .ok_or_else(|| SyncError::Moved("no table".into()))?;
    let source = t
        .info
        .table
        .primary(p)
        .ok_or_else(|| SyncError::Moved(format!("partition {p} has no primary")))?;
    let addr = t
        .info
        .nodes
        .iter()
        .find(|n| n.id == source)
        .map(|n| n.addr)
        .ok_or_else(|| SyncError::Moved(format!("node {source} has no address")))?;
    drop(t);
    let started = Instant::now();
    // Nothing is cleared here, nor when the copy fails: the first page clears what a former
    // attempt left (`pull_round`), and a table without the copy drops it (`install`). So a
    // node that cannot tell whether its copy was promoted never clears a replica by itself.
    let bytes = rounds(h, p, source, addr, rate).await?;
    let epoch = h.epoch().unwrap_or(0);
    let req = Request::SyncDone {
        node: h.id(),
        partition: p,
        epoch,
    };
    match h.peers().call_at(manager, &req).await {
        Ok((Response::Ok, _)) if promoted(h, p).await => {
            info!(partition = p, from = source, bytes, took = ?started.elapsed(), "partition copy complete");
            Ok(())
        }
        // A manager restarted since may have adopted a table without the promotion.
        Ok((Response::Ok, _)) => Err(SyncError::Moved(
            "the manager took the copy, but no table shows it promoted".into(),
        )),
        Ok((other, _)) => Err(SyncError::Moved(format!(
            "the manager declined the copy: {other:?}"
        ))),
        // The manager may have promoted the copy and its answer got lost: only the table
        // tells.
        Err(e) if promoted(h, p).await => {
            info!(
                partition = p,
                "partition copy complete (the manager's answer was lost: {e})"
            );
            Ok(())
        }
        Err(e) => Err(SyncError::Failed(format!("manager unreachable: {e}"))),
    }
}

/// Waits, at most [`FENCE_TIMEOUT`], until this node installs a table that no longer shows
/// its copy of `p` incoming (the manager publishes the promotion before it answers). Until
/// then tables may still show it incoming, even with `p` changed by another copy's
/// promotion, and the copy must not be started again: its first page would clear what the
/// manager has just made a replica. Returns whether the copy was promoted.
async fn promoted(h: &impl Host, p: PartitionId) -> bool {
    let deadline = Instant::now() + FENCE_TIMEOUT;
    loop {
        let woken = h.installed().notified();
        if let Some(t) = h.table() {
            if !t.info.table.receives(h.id(), p) {
                return t.info.table.holds(h.id(), p);
            }
        }
        if Instant::now() >= deadline {
            warn!(
                partition = p,
                "the table did not promote a copy reported complete"
            );
            return false;
        }
        h.want_refresh();
        let _ = tokio::time::timeout(PROMOTION_POLL, woken).await;
    }
}

/// Pulls rounds until the fenced last one is applied. Returns the bytes received.
async fn rounds(
    h: &impl Host,
    p: PartitionId,
    source: NodeId,
    addr: SocketAddr,
    rate: u64,
) -> Result<u64, SyncError> {
    let started = Instant::now();
    let mut bytes = 0u64;
    let mut round = 0u32;
    loop {
        let fence = round >= MAX_ROUNDS;
        let changes =
            pull_round(h, p, source, addr, round, fence, rate, started, &mut bytes).await?;
        if fence {
            return Ok(bytes);
        }
        round += 1;
        if round > 1 && changes < SMALL_ROUND {
            pull_round(h, p, source, addr, round, true, rate, started, &mut bytes).await?;
            return Ok(bytes);
        }
    }
}

/// One round, page by page. Returns the number of changes it carried.
#[allow(clippy::too_many_arguments)]
async fn pull_round(
    h: &impl Host,
    p: PartitionId,
    source: NodeId,
    addr: SocketAddr,
    round: u32,
    fence: bool,
    rate: u64,
    started: Instant,
    bytes: &mut u64,
) -> Result<usize, SyncError> {
    let mut from = 0u64;
    let mut changes = 0usize;
    let mut stale = 0u32;
    loop {
        let still = h.table().is_some_and(|t| {
            t.info.table.receives(h.id(), p) && t.info.table.primary(p) == Some(source)
        });
        if !still {
            return Err(SyncError::Moved(format!(
                "partition {p} is no longer copied here from node {source}"
            )));
        }
        let epoch = h.epoch().unwrap_or(0);
        let req = Request::Op {
            epoch,
            op: Op::SyncPull {
                partition: p,
                node: h.id(),
                round,
                from,
                fence,
            },
        };
        let (resp, data) = h
            .peers()
            .call_at(addr, &req)
            .await
            .map_err(|e| SyncError::Failed(format!("source node {source}: {e}")))?;
        match resp {
            Response::SyncPage { items, next } => {
                if round == 0 && from == 0 {
                    // A fresh copy: whatever a former attempt left goes.
                    let _ = h.store().clear(p);
                }
                changes += items.len();
                *bytes += data.len() as u64;
                h.copies()
                    .synced_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                h.store()
                    .apply_sync(p, items, &data)
                    .map_err(|e| SyncError::Failed(format!("cannot store the copy: {e}")))?;
                match next {
                    Some(n) => from = n,
                    None => return Ok(changes),
                }
            }
            Response::Error(ErrorCode::StaleEpoch { current }) => {
                // One of us is behind (every promotion publishes an epoch): wait until the
                // tables agree and ask again; the check above stops if the copy is no longer
                // wanted from this source.
                stale += 1;
                if stale > STALE_RETRIES {
                    return Err(SyncError::Moved(format!(
                        "source at epoch {current}, we at {epoch}, for too long"
                    )));
                }
                debug!(
                    partition = p,
                    current, epoch, "sync pull stale; waiting for the table"
                );
                if current > epoch {
                    h.want_refresh();
                }
                tokio::time::sleep(STALE_PAUSE).await;
                continue;
            }
            Response::Error(e) => return Err(SyncError::Failed(e.to_string())),
            other => return Err(SyncError::Failed(format!("unexpected answer {other:?}"))),
        }
        // Throttle: keep the average at or below `rate` bytes per second.
        if rate > 0 {
            let due = Duration::from_secs_f64(*bytes as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
    }
}
