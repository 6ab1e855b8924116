//! The write path: a stripe write goes to every complete replica of its partition at once,
//! primary first, with one epoch, and is re-sent across table changes, failovers and full
//! servers; a small file's last write may go out on the caller's lane.

use super::table::{lists, Key, Route};
use super::transport::{Reply, Transport};
use super::{backoff, kept_changing, retryable, unexpected, Router, MAX_ATTEMPTS};
use crate::lane::{Lane, Sent};
use crate::{Error, Result};
use bytes::Bytes;
use std::time::Duration;
use tessera_placement::{NodeId, PartitionId};
use tessera_proto::{ErrorCode, Op, Request, Response, RpcError};
use tokio::time::Instant;
use tracing::debug;

/// Waits before a stripe write refused for want of space is tried again: deleted files give
/// their space back a moment after the unlink (the servers drop their stripes in the
/// background), so a program that removes files to make room finds it, as on a local disk. A
/// cluster that stays full answers ENOSPC after these (0.6 s in all).
const NO_SPACE_WAITS: [Duration; 5] = [
    Duration::from_millis(20),
    Duration::from_millis(40),
    Duration::from_millis(80),
    Duration::from_millis(160),
    Duration::from_millis(320),
];

/// The largest write sent on a lane: the lane copies it into its frame, and a small file's
/// close is what it is for.
const LANE_WRITE_MAX: usize = 64 << 10;

/// A stripe write queued to one replica of partition `p`; `Err` if it could not even be
/// queued.
pub(crate) struct Ack<R = tessera_proto::Waiter> {
    pub node: NodeId,
    p: PartitionId,
    waiter: Result<R>,
}

/// How a write ended on the replicas waited for.
pub(crate) enum Outcome {
    Done,
    /// Must be re-sent: a replica answered stale/not ready, or these nodes were unreachable.
    Retry(Vec<NodeId>),
    Failed(Error),
}

/// One replica's acknowledgement.
async fn settle<R: Reply>(node: NodeId, waiter: Result<R>) -> Outcome {
    let waiter = match waiter {
        Ok(w) => w,
        Err(Error::Unavailable(why)) => {
            debug!(node, "write not queued: {why}");
            return Outcome::Retry(vec![node]);
        }
        Err(e) => return Outcome::Failed(e),
    };
    match waiter.wait().await {
        Ok((Response::Ok, _)) => Outcome::Done,
        Ok((Response::Error(e), _)) if retryable(&e) => Outcome::Retry(Vec::new()),
        Ok((Response::Error(e), _)) => Outcome::Failed(e.into()),
        Ok((other, _)) => Outcome::Failed(unexpected(&other)),
        Err(RpcError::Encode(m)) => Outcome::Failed(Error::Invalid(m)),
        Err(e) => {
            debug!(node, "write lost: {e}");
            Outcome::Retry(vec![node])
        }
    }
}

impl<T: Transport> Router<T> {
    /// Waits for one replica's acknowledgement; a replica the table drops meanwhile (hung, cut
    /// off) is one to re-send to.
    pub(crate) async fn wait_ack(&self, ack: Ack<T::Reply>) -> Outcome {
        let Ack { node, p, waiter } = ack;
        self.unless_dropped(node, Some(p), None, settle(node, waiter))
            .await
            .unwrap_or_else(|| Outcome::Retry(vec![node]))
    }

    /// Waits for all `acks` at once: failed if one failed, else a retry if one needs it.
    pub(crate) async fn wait_acks(&self, acks: Vec<Ack<T::Reply>>) -> Outcome {
        let mut all = Outcome::Done;
        for outcome in futures::future::join_all(acks.into_iter().map(|a| self.wait_ack(a))).await {
            all = match (all, outcome) {
                (Outcome::Failed(e), _) | (_, Outcome::Failed(e)) => Outcome::Failed(e),
                (Outcome::Retry(mut a), Outcome::Retry(b)) => {
                    a.extend(b);
                    Outcome::Retry(a)
                }
                (Outcome::Retry(a), Outcome::Done) | (Outcome::Done, Outcome::Retry(a)) => {
                    Outcome::Retry(a)
                }
                (Outcome::Done, Outcome::Done) => Outcome::Done,
            };
        }
        all
    }
}

/// A stripe write on its way on a lane ([`Router::send_write_on_lane`]).
pub(crate) struct LaneWrite {
    lane: Lane,
    sent: std::result::Result<Sent, RpcError>,
}

impl<T: Transport> Router<T> {
    /// Queues a stripe write to every complete replica of `key`'s partition at once, with
    /// `route`'s epoch, primary first; `Lost` if it has none. A replica it could not be queued
    /// to has an `Err` waiter: the write is re-sent with the others. Writes queued one after
    /// another apply in that order on every replica (one connection per node).
    pub async fn send_write(
        &self,
        route: &Route,
        key: Key,
        op: &Op,
        data: &Bytes,
    ) -> Result<Vec<Ack<T::Reply>>> {
        let req = Request::Op {
            epoch: route.epoch(),
            op: op.clone(),
        };
        let (req, p) = (&req, route.partition(key));
        Ok(
            futures::future::join_all(route.replicas(key)?.iter().map(|&node| async move {
                let waiter = match route.addr(node) {
                    Ok(addr) => {
                        self.transport
                            .send(node, addr, req, data.clone(), None)
                            .await
                    }
                    Err(e) => Err(e),
                };
                Ack { node, p, waiter }
            }))
            .await,
        )
    }

    /// Writes to every replica and waits for all, retrying across table changes and failovers.
    pub async fn write(&self, key: Key, op: &Op, data: &Bytes) -> Result<()> {
        let mut since = None;
        let mut no_space = NO_SPACE_WAITS.iter();
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            match self
                .wait_acks(self.send_write(&route, key, op, data).await?)
                .await
            {
                Outcome::Done => return Ok(()),
                Outcome::Failed(e) if e.is(&ErrorCode::NoSpace) => match no_space.next() {
                    Some(&wait) => tokio::time::sleep(wait).await,
                    None => return Err(e),
                },
                Outcome::Failed(e) => return Err(e),
                Outcome::Retry(down) if down.is_empty() => {
                    self.refresh(route.epoch()).await?;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Outcome::Retry(down) => {
                    let p = route.partition(key);
                    let since = *since.get_or_insert_with(Instant::now);
                    self.await_failover(&down, |t, n| !lists(t, n, p), since, "write")
                        .await?;
                }
            }
        }
        Err(kept_changing())
    }

    /// A small stripe write sent on `lane`, when the stripe has one replica and its node is
    /// not the one `beside` (a request the thread makes while this is on its way) goes to;
    /// `None` otherwise, nothing sent. [`Self::finish_lane_write`] reads the answer.
    pub async fn send_write_on_lane(
        &self,
        lane: &Lane,
        key: Key,
        op: &Op,
        data: &Bytes,
        beside: Key,
    ) -> Option<LaneWrite> {
        if data.len() > LANE_WRITE_MAX || !lane.here() {
            return None;
        }
        let route = self.route();
        let node = match route.replicas(key) {
            Ok(&[node]) if route.primary(beside).ok() != Some(node) => node,
            _ => return None,
        };
        let addr = route.addr(node).ok()?;
        let req = Request::Op {
            epoch: route.epoch(),
            op: op.clone(),
        };
        let sent = self
            .transport
            .send_on_lane(lane, node, addr, &req, data)
            .await
            .ok()??;
        Some(LaneWrite {
            lane: lane.clone(),
            sent,
        })
    }

    /// The answer to a [`Self::send_write_on_lane`]; a write that failed or was refused is sent
    /// again as [`Self::write`] sends it (across table changes, failovers and full servers).
    pub async fn finish_lane_write(
        &self,
        w: LaneWrite,
        key: Key,
        op: &Op,
        data: &Bytes,
    ) -> Result<()> {
        let why = match w.sent.and_then(|sent| w.lane.answer(sent)) {
            Ok((Response::Ok, _)) => return Ok(()),
            Ok((Response::Error(e), _)) => e.to_string(),
            Ok((other, _)) => return Err(unexpected(&other)),
            Err(e) => e.to_string(),
        };
        debug!("a write on a lane did not go through ({why}), sending it again");
        self.write(key, op, data).await
    }
}
