//! The delay line, for kernels without `netem`: an iptables rule in each host queues the
//! packets it receives on `eth0` (NFQUEUE 0, metadata only), and a thread of this process
//! holds each one's verdict for the latency, then accepts it, or drops it with the loss's
//! probability. The latency being the same for every packet, verdicts are given in order: one
//! batch verdict accepts every packet due. Held where they arrive, packets no longer count
//! against their sender's socket (TCP small queues would throttle a sender whose packets are
//! held before they leave it).

use crate::{io_error, HostsError};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// netfilter's queue over netlink (linux/netfilter/nfnetlink_queue.h).
const SUBSYS_QUEUE: u16 = 3 << 8;
const MSG_PACKET: u16 = SUBSYS_QUEUE;
const MSG_VERDICT: u16 = SUBSYS_QUEUE | 1;
const MSG_CONFIG: u16 = SUBSYS_QUEUE | 2;
const MSG_VERDICT_BATCH: u16 = SUBSYS_QUEUE | 3;
const ATTR_PACKET_HDR: u16 = 1;
const ATTR_VERDICT_HDR: u16 = 2;
const CFG_CMD: u16 = 1;
const CFG_PARAMS: u16 = 2;
const CFG_QUEUE_MAXLEN: u16 = 3;
const CFG_MASK: u16 = 4;
const CFG_FLAGS: u16 = 5;
const CMD_BIND: u8 = 1;
const COPY_META: u8 = 1;
/// GSO packets are queued whole, not cut into segments first.
const FLAG_GSO: u32 = 4;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NLMSG_ERROR: u16 = 2;
/// Packets a queue holds: far more than a link's bandwidth times its latency.
const QUEUE_LEN: u32 = 65536;

/// A host's queue: its socket and the packets held, with when each is due.
struct Queue {
    fd: OwnedFd,
    held: VecDeque<(u32, Instant)>,
}

pub(crate) struct DelayLine {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DelayLine {
    /// Binds queue 0 in each of the network namespaces `netns` and starts holding packets.
    pub(crate) fn start(
        netns: Vec<PathBuf>,
        latency: Duration,
        loss: f64,
    ) -> Result<Self, HostsError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, bound) = std::sync::mpsc::channel();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hosts-delay-line".into())
            .spawn(move || {
                let queues: Result<Vec<Queue>, HostsError> =
                    netns.iter().map(|n| bind(n)).collect();
                match queues {
                    Ok(queues) => {
                        let _ = ready.send(Ok(()));
                        hold(queues, latency, loss, &stopping);
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            })
            .map_err(io_error("starting the delay line"))?;
        let line = Self {
            stop,
            thread: Some(thread),
        };
        bound
            .recv()
            .map_err(|_| HostsError::Invalid("the delay line ended as it started".into()))??;
        Ok(line)
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn os_error(what: &str) -> HostsError {
    io_error(what)(std::io::Error::last_os_error())
}

/// A netlink message of the queue subsystem for queue 0.
fn message(kind: u16, flags: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]); // nfgenmsg: family, version, queue
    for (kind, value) in attrs {
        m.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(value);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    m[6..8].copy_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m
}

fn send(fd: &OwnedFd, msg: &[u8]) -> Result<(), HostsError> {
    // SAFETY: sends `msg`'s bytes on a socket we own.
    let sent = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if sent != msg.len() as isize {
        return Err(os_error("sending to the packet queue"));
    }
    Ok(())
}

/// Sends a configuration message and waits for its acknowledgement.
fn configure(fd: &OwnedFd, attrs: &[(u16, &[u8])]) -> Result<(), HostsError> {
    send(fd, &message(MSG_CONFIG, libc::NLM_F_ACK as u16, attrs))?;
    let mut buf = [0u8; 1024];
    // SAFETY: receives into a buffer we own, within its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 20 || u16::from_ne_bytes([buf[4], buf[5]]) != NLMSG_ERROR {
        return Err(os_error("no answer from the packet queue"));
    }
    match i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]) {
        0 => Ok(()),
        e => Err(io_error("configuring the packet queue (NFQUEUE)")(
            std::io::Error::from_raw_os_error(-e),
        )),
    }
}

/// Opens a socket in the network namespace at `netns` (this thread moves there) and binds
/// its queue 0.
fn bind(netns: &Path) -> Result<Queue, HostsError> {
    let path = crate::c_path(netns.as_os_str().as_encoded_bytes())?;
    crate::enter_netns(&path).map_err(io_error(format!("entering {}", netns.display())))?;
    // SAFETY: plain socket calls on values we own; the descriptor is owned at once.
    let fd = unsafe {
        let raw = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        );
        if raw < 0 {
            return Err(os_error("opening a netfilter socket"));
        }
        OwnedFd::from_raw_fd(raw)
    };
    // SAFETY: sockaddr_nl is plain data; zero is "the kernel picks".
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    let buffer: libc::c_int = 8 << 20;
    // SAFETY: pointers to values that live through the calls, with their sizes.
    unsafe {
        if libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of_val(&addr) as u32,
        ) != 0
        {
            return Err(os_error("binding a netfilter socket"));
        }
        // Room for many notices: one lost would hold its packet until the next batch verdict.
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            std::ptr::addr_of!(buffer).cast(),
            std::mem::size_of_val(&buffer) as u32,
        );
    }
    configure(&fd, &[(CFG_CMD, &[CMD_BIND, 0, 0, 0])])?;
    let mut params = 0u32.to_be_bytes().to_vec();
    params.push(COPY_META);
    configure(
        &fd,
        &[
            (CFG_PARAMS, &params),
            (CFG_QUEUE_MAXLEN, &QUEUE_LEN.to_be_bytes()),
            (CFG_MASK, &FLAG_GSO.to_be_bytes()),
            (CFG_FLAGS, &FLAG_GSO.to_be_bytes()),
        ],
    )?;
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok(Queue {
        fd,
        held: VecDeque::new(),
    })
}

fn verdict(fd: &OwnedFd, kind: u16, verdict: u32, id: u32) -> Result<(), HostsError> {
    let mut hdr = verdict.to_be_bytes().to_vec();
    hdr.extend_from_slice(&id.to_be_bytes());
    send(fd, &message(kind, 0, &[(ATTR_VERDICT_HDR, &hdr)]))
}

/// The ids of the packets in a buffer of queue messages.
fn packet_ids(buf: &[u8], mut found: impl FnMut(u32)) {
    let mut off = 0;
    while off + 20 <= buf.len() {
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        if len < 20 || off + len > buf.len() {
            return;
        }
        if u16::from_ne_bytes([buf[off + 4], buf[off + 5]]) == MSG_PACKET {
            let mut a = off + 20;
            while a + 4 <= off + len {
                let alen = u16::from_ne_bytes([buf[a], buf[a + 1]]) as usize;
                let kind = u16::from_ne_bytes([buf[a + 2], buf[a + 3]]) & 0x3fff;
                if alen < 4 || a + alen > off + len {
                    break;
                }
                if kind == ATTR_PACKET_HDR && alen >= 8 {
                    found(u32::from_be_bytes([
                        buf[a + 4],
                        buf[a + 5],
                        buf[a + 6],
                        buf[a + 7],
                    ]));
                }
                a += alen.next_multiple_of(4);
            }
        }
        off += len.next_multiple_of(4);
    }
}

/// Holds every queued packet for `latency`, until `stop`.
fn hold(mut queues: Vec<Queue>, latency: Duration, loss: f64, stop: &AtomicBool) {
    // SAFETY: prctl on this thread: wake-ups as close to the deadlines as the timers allow.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1) };
    let mut buf = vec![0u8; 1 << 16];
    let mut polls: Vec<libc::pollfd> = queues
        .iter()
        .map(|q| libc::pollfd {
            fd: q.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let mut next = now + Duration::from_millis(50);
        for q in &mut queues {
            let mut due = None;
            while let Some(&(id, at)) = q.held.front() {
                if at > now {
                    next = next.min(at);
                    break;
                }
                due = Some(id);
                q.held.pop_front();
            }
            if let Some(id) = due {
                let _ = verdict(&q.fd, MSG_VERDICT_BATCH, NF_ACCEPT, id);
            }
        }
        let wait = next.saturating_duration_since(Instant::now());
        let timeout = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the pollfd array and timespec live through the call.
        let ready = unsafe {
            libc::ppoll(
                polls.as_mut_ptr(),
                polls.len() as libc::nfds_t,
                &timeout,
                std::ptr::null(),
            )
        };
        if ready <= 0 {
            continue;
        }
        for (q, p) in queues.iter_mut().zip(&polls) {
            if p.revents == 0 {
                continue;
            }
            loop {
                // SAFETY: receives into a buffer we own, within its length.
                let n =
                    unsafe { libc::recv(q.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                // EAGAIN: drained; ENOBUFS: notices were lost, the next batch verdict
                // releases their packets.
                if n <= 0 {
                    break;
                }
                let at = Instant::now() + latency;
                packet_ids(&buf[..n as usize], |id| {
                    if loss > 0.0 && rand::random::<f64>() < loss {
                        let _ = verdict(&q.fd, MSG_VERDICT, NF_DROP, id);
                    } else {
                        q.held.push_back((id, at));
                    }
                });
            }
        }
    }
    // Nothing stays held: the namespaces may outlive the line.
    for q in &queues {
        if let Some(&(id, _)) = q.held.back() {
            let _ = verdict(&q.fd, MSG_VERDICT_BATCH, NF_ACCEPT, id);
        }
    }
}
