//! The sending side of a partition copy, at the partition's primary: each receiver's pull is a
//! session of rounds, each round a snapshot and its changes since the round before, sent a
//! page at a time.

use super::Host;
use crate::node::{err, now, stale, Answer, Installed};
use crate::store::{lock, Delta, Snapshot};
use bytes::BytesMut;
use std::sync::Arc;
use tessera_placement::{Epoch, NodeId, PartitionId};
use tessera_proto::{ErrorCode, Reply, Response, SyncItem};

/// A sync page carries at most this many stripe bytes, or this many items.
const PAGE_BYTES: usize = 16 << 20;
const PAGE_ITEMS: usize = 8192;

/// One node's pull of one partition, as the primary sees it: the last snapshot sent and the
/// round being paged through.
pub(super) struct Session {
    round: u32,
    base: Snapshot,
    delta: Delta,
}

/// The primary's side of a sync: page `from` of round `round` of `node`'s pull of
/// partition `p`. Page 0 takes a new snapshot (fencing the partition first, if asked).
#[allow(clippy::too_many_arguments)]
pub(crate) fn pull(
    h: &Arc<impl Host>,
    t: &Installed,
    epoch: Epoch,
    p: PartitionId,
    node: NodeId,
    round: u32,
    from: u64,
    fence: bool,
) -> Reply {
    let table = &t.info.table;
    if epoch > table.epoch() {
        h.want_refresh();
        return now(err(stale(table.epoch())));
    }
    if p >= table.partitions() {
        return now(err(ErrorCode::Invalid(format!("no partition {p}"))));
    }
    if table.primary(p) != Some(h.id()) || !table.receives(node, p) || epoch < table.changed(p) {
        return now(err(stale(table.epoch())));
    }
    if from > 0 {
        return now(page(&**h, p, node, round, from));
    }
    if !fence {
        return now(start_round(&**h, p, node, round));
    }
    // Fenced after any replicated change in flight on this partition has finished.
    let h = h.clone();
    Reply::Later(Box::pin(async move {
        let _one_at_a_time = h.meta_lock(p).lock().await;
        if let Err(e) = h.copies().fence(&*h, p, node) {
            return err(e);
        }
        start_round(&*h, p, node, round)
    }))
}

/// Starts round `round` of `node`'s pull of `p`: a snapshot, and its changes since the
/// previous round's snapshot (everything, for round 0).
fn start_round(h: &impl Host, p: PartitionId, node: NodeId, round: u32) -> Answer {
    let snap = match h.store().snapshot(p) {
        Ok(s) => s,
        Err(e) => return err(e),
    };
    let mut sessions = lock(&h.copies().sessions);
    let base = match sessions.remove(&(p, node)) {
        _ if round == 0 => None,
        Some(s) if s.round.checked_add(1) == Some(round) => Some(s.base),
        _ => {
            return err(ErrorCode::Invalid(format!(
                "no round {} of partition {p} to continue from: start the copy again",
                round - 1
            )))
        }
    };
    let delta = snap.delta_from(base.as_ref());
    sessions.insert(
        (p, node),
        Session {
            round,
            base: snap,
            delta,
        },
    );
    drop(sessions);
    page(h, p, node, round, 0)
}

fn page(h: &impl Host, p: PartitionId, node: NodeId, round: u32, from: u64) -> Answer {
    let sessions = lock(&h.copies().sessions);
    let Some(s) = sessions.get(&(p, node)).filter(|s| s.round == round) else {
        return err(ErrorCode::Invalid(format!(
            "no round {round} of partition {p} in progress: start the copy again"
        )));
    };
    let items = &s.delta.items;
    let start = usize::try_from(from).unwrap_or(usize::MAX).min(items.len());
    // Stripe bytes of the items before `start`, to find where this page's data begins.
    let mut stripe_no = items[..start]
        .iter()
        .filter(|i| matches!(i, SyncItem::Stripe { .. }))
        .count();
    let mut out = Vec::new();
    let mut data = BytesMut::new();
    let mut end = start;
    while end < items.len() && out.len() < PAGE_ITEMS && data.len() < PAGE_BYTES {
        if matches!(items[end], SyncItem::Stripe { .. }) {
            data.extend_from_slice(&s.delta.data[stripe_no]);
            stripe_no += 1;
        }
        out.push(items[end].clone());
        end += 1;
    }
    let next = (end < items.len()).then_some(end as u64);
    (Response::SyncPage { items: out, next }, data.freeze())
}
