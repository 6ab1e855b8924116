//! Multiplexed RPC over one TCP connection.
//!
//! A client keeps any number of requests in flight on one connection: a caller puts its frame
//! on the socket itself when nothing is queued before it (else a writer task sends it, in
//! order), and a reader task matches responses to waiting callers by request id. A server
//! answers the requests of one connection in the order they arrived, on the task that reads
//! them (store operations are in-memory and short), so a client's writes on one connection
//! apply in the order it sent them. Round trips matter: metadata operations are made of them.
//!
//! The client half is in [`client`] ([`RpcClient`]), the serving half in [`server`]
//! ([`serve`]); both share the settings and errors here.

mod client;
mod server;
#[cfg(test)]
mod tests;

pub(crate) use client::dial;
pub use client::{NoticeSink, RpcClient, Sink, Waiter, OUTBOX_MAX};
pub use server::{serve, Conn, Handler, Reply, Watcher, Watchers, MAX_DETACHED, MAX_HANDSHAKING};

use crate::auth::{AuthError, Secret};
use crate::frame::Limits;
use crate::pool::BufferPool;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Reads go through a smaller buffer than writes. A buffered reader reads a payload straight
/// into its destination only while the rest is at least a buffer long; otherwise it refills
/// with whatever the socket holds, the next frame's payload included, and copies that again:
/// with 256 KiB, up to a quarter of every 1 MiB stripe took that extra copy (5.6 % of the
/// mount's time in a sequential read). 32 KiB still holds many small answers.
const READ_BUF: usize = 32 << 10;

/// How long a request may take to arrive once its first byte has. A connection stalled in the
/// middle of a frame is closed, and the memory of the part received goes with it; between
/// requests a connection may stay idle as long as it likes.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections one listening port serves at once, in their handshake or past it, unless
/// `RpcConfig::max_connections` says otherwise. Past it a new connection is closed as soon as
/// it is accepted, unread, with a warning: its peer sees a failed connect (a client tries
/// another replica, or again later), and the connections already served go on.
pub const MAX_CONNECTIONS: usize = 16384;

/// Settings shared by every connection of a process.
#[derive(Debug)]
pub struct RpcConfig {
    pub secret: Secret,
    pub limits: Limits,
    /// Where received payloads are read into. Serving, a request's payload may be at most one
    /// of its buffers (a stripe, on a server).
    pub pool: Arc<BufferPool>,
    pub connect_timeout: Duration,
    /// How long a caller waits for a response before giving up on it.
    pub request_timeout: Duration,
    /// Serving: how long a request may take to arrive once begun (`FRAME_TIMEOUT`).
    pub frame_timeout: Duration,
    /// Serving: connections a listening port serves at once (`MAX_CONNECTIONS`).
    pub max_connections: usize,
}

impl RpcConfig {
    #[must_use]
    pub fn new(secret: Secret, pool: Arc<BufferPool>) -> Self {
        Self {
            secret,
            limits: Limits::default(),
            pool,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            frame_timeout: FRAME_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot connect to {addr}: {source}")]
    Auth { addr: SocketAddr, source: AuthError },
    #[error("connection to {addr} lost: {reason}")]
    Closed { addr: SocketAddr, reason: String },
    #[error("request to {addr} got no answer within {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("cannot encode request: {0}")]
    Encode(String),
    #[error("{addr} refused: {why}")]
    Refused { addr: SocketAddr, why: String },
}
