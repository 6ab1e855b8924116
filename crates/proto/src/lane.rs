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
//! [`LaneConn::recv_within`] gives up earlier on a server that has not begun to answer, and
//! can be called again: its caller checks meanwhile whether the server is still one to wait for.

use crate::frame::{encode_head, parse_prefix, FrameError, FrameKind, Limits, PREFIX_LEN};
use crate::msg::{Request, Response};
use crate::pool::BufferPool;
use crate::rpc::{dial, RpcConfig, RpcError};
use bytes::Bytes;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Answers are read through a buffer this large: one `recv` for most metadata answers, while
/// a thread's buffers to every server stay small (larger answers are read straight into
/// their own memory).
const READ_BUF: usize = 16 << 10;

/// The socket's read timeout: how often a blocked read looks at its clock, so a wait can end
/// sooner than `request_timeout` ([`LaneConn::recv_within`]).
const READ_SLICE: Duration = Duration::from_millis(100);

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
            .set_read_timeout(Some(READ_SLICE.min(cfg.request_timeout)))
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
            // Part of connecting: a server that does not answer it is one to give up on as
            // soon as one that does not accept the connection.
            conn.send(&Request::Attach { watcher }, &[])?;
            match conn.recv_within(cfg.connect_timeout)? {
                Some((Response::Ok, _)) => {}
                Some((other, _)) => {
                    return Err(RpcError::Refused {
                        addr,
                        why: format!("cannot attach to watcher {watcher}: {other:?}"),
                    })
                }
                None => {
                    return Err(RpcError::Connect {
                        addr,
                        source: ErrorKind::TimedOut.into(),
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
        match self.recv_within(self.timeout)? {
            Some(answer) => Ok(answer),
            None => Err(self.io(ErrorKind::TimedOut.into())),
        }
    }

    /// [`Self::recv`], but `None` if no byte of the answer came within `within`: the request
    /// is still on its way, and this may be called again. Once the answer begins, the rest is
    /// waited for up to `request_timeout`.
    pub fn recv_within(&mut self, within: Duration) -> Result<Option<(Response, Bytes)>, RpcError> {
        if !self.broken {
            return Err(self.closed("no request is waiting for an answer".into()));
        }
        let started = Instant::now();
        loop {
            match self.rd.fill_buf() {
                Ok([]) => return Err(self.closed("the server closed the connection".into())),
                Ok(_) => break,
                Err(e) if quiet(&e) || e.kind() == ErrorKind::Interrupted => {
                    if started.elapsed() >= within {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(self.io(e)),
            }
        }
        let answer = self.read_answer(Instant::now() + self.timeout)?;
        self.broken = false;
        Ok(Some(answer))
    }

    #[must_use]
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    fn read_answer(&mut self, deadline: Instant) -> Result<(Response, Bytes), RpcError> {
        let mut prefix = [0u8; PREFIX_LEN];
        self.read_full(&mut prefix, deadline)?;
        let mut head = parse_prefix(&prefix, self.limits).map_err(|e| self.frame(e))?;
        if head.kind != FrameKind::Response || head.id != self.next_id {
            return Err(self.closed(format!(
                "expected the answer to request {}, got a {:?} frame for {}",
                self.next_id, head.kind, head.id
            )));
        }
        self.read_full(&mut head.header, deadline)?;
        let resp: Response = postcard::from_bytes(&head.header)
            .map_err(|e| self.closed(format!("undecodable response: {e}")))?;
        let payload = if head.payload_len == 0 {
            Bytes::new()
        } else {
            let mut buf = self.pool.get(head.payload_len);
            buf.resize(head.payload_len, 0);
            self.read_full(&mut buf, deadline)?;
            buf.freeze()
        };
        Ok((resp, payload))
    }

    /// Fills `buf`, across the socket's read timeouts, until `deadline`.
    fn read_full(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), RpcError> {
        let mut got = 0;
        while got < buf.len() {
            match self.rd.read(&mut buf[got..]) {
                Ok(0) => return Err(self.closed("the server closed the connection".into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if quiet(&e) && Instant::now() < deadline => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        Ok(())
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

/// A read that timed out (the socket's [`READ_SLICE`]): nothing was read.
fn quiet(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}
