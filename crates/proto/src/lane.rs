//! A connection one thread uses synchronously: it writes a request and reads the answer off
//! the socket itself, blocking.
//!
//! Why: on a multiplexed `RpcClient`, an answer is read by the connection's reader task, which
//! then wakes the caller. For a FUSE worker waiting on one metadata request that is one more
//! thread hand-off per request, and on two vCPUs each hand-off is a wake-up of a sleeping CPU.
//! A lane is what a FUSE worker thread keeps to each server for its own requests (one in
//! flight at a time). It is not subscribed; `Request::Attach` makes the promises its answers
//! carry go to the client's subscribed connection, so notices keep working.
//!
//! Only for threads that may block (never a runtime worker): every call blocks until its
//! answer or `request_timeout`. A connection that failed or timed out is not used again.

use crate::frame::{encode_head, parse_prefix, FrameError, FrameKind, Limits, PREFIX_LEN};
use crate::msg::{Request, Response};
use crate::pool::BufferPool;
use crate::rpc::{dial, RpcConfig, RpcError};
use bytes::Bytes;
use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Answers are read through a buffer this large: one `recv` for most metadata answers, while
/// a thread's buffers to every server stay small (larger answers are read straight into
/// their own memory).
const READ_BUF: usize = 16 << 10;

pub struct LaneConn {
    rd: BufReader<TcpStream>,
    addr: SocketAddr,
    limits: Limits,
    pool: Arc<BufferPool>,
    timeout: Duration,
    next_id: u64,
    broken: bool,
}

impl LaneConn {
    /// Connects and, given a subscribed connection's `watcher` id, attaches to it (that
    /// request blocks, as `call` does: await this off the runtime's workers too).
    pub async fn connect(
        addr: SocketAddr,
        cfg: &RpcConfig,
        watcher: Option<u64>,
    ) -> Result<Self, RpcError> {
        let io = |source: std::io::Error| RpcError::Connect { addr, source };
        let stream = dial(addr, cfg).await?.into_std().map_err(io)?;
        stream.set_nonblocking(false).map_err(io)?;
        stream
            .set_read_timeout(Some(cfg.request_timeout))
            .map_err(io)?;
        stream
            .set_write_timeout(Some(cfg.request_timeout))
            .map_err(io)?;
        let mut conn = Self {
            rd: BufReader::with_capacity(READ_BUF, stream),
            addr,
            limits: cfg.limits,
            pool: cfg.pool.clone(),
            timeout: cfg.request_timeout,
            next_id: 0,
            broken: false,
        };
        if let Some(watcher) = watcher {
            match conn.call(&Request::Attach { watcher }, &[])?.0 {
                Response::Ok => {}
                other => {
                    return Err(RpcError::Refused {
                        addr,
                        why: format!("cannot attach to watcher {watcher}: {other:?}"),
                    })
                }
            }
        }
        Ok(conn)
    }

    /// Sends `req` and blocks until its answer is in.
    pub fn call(&mut self, req: &Request, payload: &[u8]) -> Result<(Response, Bytes), RpcError> {
        self.send(req, payload)?;
        self.recv()
    }

    /// Writes `req` without waiting for its answer, which [`Self::recv`] reads: the thread can
    /// ask another server something meanwhile. Nothing else may be sent on this connection
    /// before that answer is read.
    pub fn send(&mut self, req: &Request, payload: &[u8]) -> Result<(), RpcError> {
        if self.broken {
            return Err(self.closed("an earlier request on it failed".into()));
        }
        let header = postcard::to_allocvec(req).map_err(|e| RpcError::Encode(e.to_string()))?;
        self.next_id += 1;
        let mut out = encode_head(self.next_id, FrameKind::Request, &header, payload.len())
            .map_err(|e| RpcError::Encode(e.to_string()))?;
        out.extend_from_slice(payload);
        // Until the answer is read, the stream is mid-frame or has an answer unread.
        self.broken = true;
        self.rd.get_ref().write_all(&out).map_err(|e| self.io(e))
    }

    /// Blocks until the answer to the request [`Self::send`] wrote is in.
    pub fn recv(&mut self) -> Result<(Response, Bytes), RpcError> {
        if !self.broken {
            return Err(self.closed("no request is waiting for an answer".into()));
        }
        let answer = self.read_answer()?;
        self.broken = false;
        Ok(answer)
    }

    #[must_use]
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    fn read_answer(&mut self) -> Result<(Response, Bytes), RpcError> {
        let mut prefix = [0u8; PREFIX_LEN];
        self.rd.read_exact(&mut prefix).map_err(|e| self.io(e))?;
        let mut head = parse_prefix(&prefix, self.limits).map_err(|e| self.frame(e))?;
        if head.kind != FrameKind::Response || head.id != self.next_id {
            return Err(self.closed(format!(
                "expected the answer to request {}, got a {:?} frame for {}",
                self.next_id, head.kind, head.id
            )));
        }
        self.rd
            .read_exact(&mut head.header)
            .map_err(|e| self.io(e))?;
        let resp: Response = postcard::from_bytes(&head.header)
            .map_err(|e| self.closed(format!("undecodable response: {e}")))?;
        let payload = if head.payload_len == 0 {
            Bytes::new()
        } else {
            let mut buf = self.pool.get(head.payload_len);
            buf.resize(head.payload_len, 0);
            self.rd.read_exact(&mut buf).map_err(|e| self.io(e))?;
            buf.freeze()
        };
        Ok((resp, payload))
    }

    fn closed(&self, reason: String) -> RpcError {
        RpcError::Closed {
            addr: self.addr,
            reason,
        }
    }

    fn io(&self, e: std::io::Error) -> RpcError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => RpcError::Timeout {
                addr: self.addr,
                after: self.timeout,
            },
            _ => self.closed(e.to_string()),
        }
    }

    fn frame(&self, e: FrameError) -> RpcError {
        self.closed(e.to_string())
    }
}
