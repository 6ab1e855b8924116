//! A restarted manager recovering the cluster from the tables its servers hold: their claims
//! ([`State::rejoin`]), the newest table adopted, and after one dead-node time a new
//! generation of epochs above every one reported (docs/SEMANTICS.md, "Manager restarts").

use super::{Member, State};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Instant;
use tessera_placement::{Epoch, NodeId};
use tessera_proto::{ErrorCode, TableInfo};
use tracing::info;

/// The low bits of an epoch count within one manager's life; a restarted manager publishes
/// from the next multiple of `GENERATION + 1`.
pub(super) const GENERATION: Epoch = u32::MAX as Epoch;

impl State {
    /// A server this manager does not know claims its place with the table it holds. A
    /// manager without a table (restarted) adopts the newest table claimed and recovers the
    /// cluster from it: for one dead-node time it takes the claims of the servers in it and
    /// changes nothing, then re-plans without those that did not come back (see
    /// [`State::tick`]). Servers that registered afresh before the first claim held nothing;
    /// they are forgotten, to join again under ids that do not collide with the table's.
    pub fn rejoin(
        &mut self,
        node: NodeId,
        addr: SocketAddr,
        capacity: u64,
        label: Option<String>,
        claim: TableInfo,
        now: Instant,
    ) -> Result<NodeId, ErrorCode> {
        if claim.config != self.config {
            return Err(ErrorCode::Invalid(format!(
                "the server's cluster ({:?}) is not this manager's ({:?})",
                claim.config, self.config
            )));
        }
        if capacity == 0 {
            return Err(ErrorCode::Invalid("a server must offer some memory".into()));
        }
        let epoch = claim.table.epoch();
        self.seen = self.seen.max(epoch);
        let adopt = match (&self.table, self.recovering_until) {
            (None, _) => true,
            (Some(t), Some(_)) => epoch > t.table.epoch(),
            (Some(_), None) => false,
        };
        if adopt {
            self.adopt(claim, now);
        }
        if let Some(m) = self.members.iter().find(|m| m.id == node && !m.dead) {
            // A repeated claim (its answer was lost) is answered again.
            return if m.addr == addr {
                Ok(node)
            } else {
                Err(ErrorCode::NotFound)
            };
        }
        let listed = self
            .table
            .as_ref()
            .is_some_and(|t| t.nodes.iter().any(|n| n.id == node && n.addr == addr));
        if !listed || self.recovering_until.is_none() {
            return Err(ErrorCode::NotFound);
        }
        self.next_id = self.next_id.max(node.saturating_add(1));
        self.members
            .push(Member::new(node, addr, capacity, label, now));
        info!(node, %addr, epoch, "a server of the running cluster rejoined");
        Ok(node)
    }

    /// Takes `claim` as the cluster's table, to recover from.
    pub(super) fn adopt(&mut self, claim: TableInfo, now: Instant) {
        let t = &claim.table;
        info!(
            epoch = t.epoch(),
            servers = claim.nodes.len(),
            "recovering a running cluster from the table its servers hold"
        );
        let listed: BTreeSet<(NodeId, SocketAddr)> =
            claim.nodes.iter().map(|n| (n.id, n.addr)).collect();
        // Told `NotFound` at their next beat, they join again as new nodes.
        self.members.retain(|m| listed.contains(&(m.id, m.addr)));
        self.goal = t
            .all()
            .iter()
            .zip(t.all_incoming())
            .map(|(r, i)| r.iter().chain(i).copied().collect())
            .collect();
        let top = listed.iter().map(|&(id, _)| id).max().unwrap_or(0);
        self.next_id = self.next_id.max(top.saturating_add(1));
        self.table = Some(claim);
        self.recovering_until
            .get_or_insert(now + self.heartbeat_timeout);
    }

    /// The end of a recovery: re-plans without the servers of the table that did not come
    /// back, and with those that joined meanwhile, in a new generation of epochs.
    pub(super) fn recovered(&mut self, now: Instant) -> Option<Epoch> {
        self.recovering_until = None;
        self.reap(now);
        let info = self.table.as_ref()?;
        let live: BTreeSet<NodeId> = self.live_weights().iter().map(|w| w.node).collect();
        let listed: BTreeSet<NodeId> = info.nodes.iter().map(|n| n.id).collect();
        info!(
            epoch = info.table.epoch(),
            back = live.intersection(&listed).count(),
            of = listed.len(),
            new = live.difference(&listed).count(),
            "the cluster is recovered"
        );
        // The previous manager may have published tables no server installed yet (a client
        // may hold one): this one's epochs go on from the next generation, above any of them.
        // The re-plan also replaces the adopted goal, which is just what the table lists.
        self.seen = self.seen.max(info.table.epoch()) | GENERATION;
        self.replan("recovered")
    }
}
