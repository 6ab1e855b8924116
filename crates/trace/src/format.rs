//! The bytes of a trace file. All integers little-endian; `v` is an unsigned LEB128 varint,
//! `z` a zigzag-encoded signed one.
//!
//! ```text
//! file   = MAGIC version:u16 len:u32 xxh3:u64 header[len] chunk*
//! header = (key:string value:string)*            string = v(len) bytes
//! chunk  = "TCHK" len:u32 xxh3:u64 item*         (xxh3 of the item bytes)
//! item   = 1 v(id) string                        a string definition (path, exe name)
//!        | 2                                     forget every string (ids start at 0 again)
//!        | 3 op:u8 bits:u8 v(pid) v(uid) [v(exe)] v(ino) [v(path)] [v(target)] v(offset)
//!            v(size) [v(server_size)] v(flags) z(start - previous start in the chunk)
//!            v(end - start) z(result)             a record; bits: mode (0-1), via
//!                                                 handle (2), then which [] are there (3-6)
//!        | 4 v(dropped) v(from) v(to)            a gap
//!        | 5 v(records) v(dropped)               the end: the writer stopped cleanly
//! ```

use crate::record::{Event, Mode};
use crate::Error;

/// The first bytes of every trace.
pub const MAGIC: [u8; 8] = *b"\x7fTTRACE\n";
/// This format's version; a reader refuses a newer one.
pub const VERSION: u16 = 1;

pub(crate) const CHUNK_MAGIC: [u8; 4] = *b"TCHK";
/// magic, length, checksum.
pub(crate) const CHUNK_HEAD: usize = 16;

pub(crate) const T_DEF: u8 = 1;
pub(crate) const T_RESET: u8 = 2;
pub(crate) const T_REC: u8 = 3;
pub(crate) const T_GAP: u8 = 4;
pub(crate) const T_END: u8 = 5;

pub(crate) const B_VIA: u8 = 1 << 2;
pub(crate) const B_EXE: u8 = 1 << 3;
pub(crate) const B_PATH: u8 = 1 << 4;
pub(crate) const B_TARGET: u8 = 1 << 5;
pub(crate) const B_SERVER: u8 = 1 << 6;

/// The most bytes a record item takes (2 tag bytes, 13 varints of at most 10).
pub(crate) const REC_MAX: usize = 2 + 13 * 10;
/// The most bytes a gap or end item takes.
pub(crate) const GAP_MAX: usize = 1 + 3 * 10;
/// The most bytes a string definition takes beyond the string.
pub(crate) const DEF_OVERHEAD: usize = 1 + 2 * 10;

pub(crate) fn put_v(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_z(out: &mut Vec<u8>, v: i64) {
    put_v(out, ((v << 1) ^ (v >> 63)) as u64);
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_v(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// Reads items out of a chunk's bytes; `None` when they end early or run past it.
pub(crate) struct Cursor<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub(crate) fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    pub(crate) fn v(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    pub(crate) fn z(&mut self) -> Option<i64> {
        let v = self.v()?;
        Some((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    pub(crate) fn u32v(&mut self) -> Option<u32> {
        u32::try_from(self.v()?).ok()
    }

    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.v()?).ok()?;
        let end = self.pos.checked_add(len)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
}

/// Encodes a record item; strings are given as interned ids.
pub(crate) fn put_record(out: &mut Vec<u8>, e: &Event<'_>, ids: [Option<u64>; 3], prev_start: u64) {
    let [exe, path, target] = ids;
    let mut bits = e.mode.code();
    for (on, bit) in [
        (e.via_handle, B_VIA),
        (exe.is_some(), B_EXE),
        (path.is_some(), B_PATH),
        (target.is_some(), B_TARGET),
        (e.server_size.is_some(), B_SERVER),
    ] {
        if on {
            bits |= bit;
        }
    }
    out.push(T_REC);
    out.push(e.op.code());
    out.push(bits);
    put_v(out, e.pid.into());
    put_v(out, e.uid.into());
    if let Some(id) = exe {
        put_v(out, id);
    }
    put_v(out, e.ino);
    for id in [path, target].into_iter().flatten() {
        put_v(out, id);
    }
    put_v(out, e.offset);
    put_v(out, e.size);
    if let Some(s) = e.server_size {
        put_v(out, s);
    }
    put_v(out, e.flags.into());
    put_z(out, e.start_ns.wrapping_sub(prev_start) as i64);
    put_v(out, e.end_ns.saturating_sub(e.start_ns));
    put_z(out, e.result);
}

/// What a trace says about itself: where and when it was taken, of what, and the codes its
/// records use (so that other tools can read it without this crate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub host: String,
    /// The tracing process (the mount).
    pub pid: u32,
    /// Wall-clock time (ns since the Unix epoch) of the trace's time 0; record times are
    /// monotonic nanoseconds since then.
    pub unix_ns: u64,
    /// What was traced, e.g. `fuse /mnt/tessera`.
    pub source: String,
    /// The mount's mode (a handle opened with O_DIRECT may differ: see each record).
    pub mode: Mode,
    /// Keys this reader does not interpret, as written.
    pub extra: Vec<(String, String)>,
}

impl Header {
    /// A header for a new trace; its clock is set by [`crate::Writer::create`].
    pub fn new(host: String, pid: u32, source: String, mode: Mode) -> Self {
        Header {
            version: VERSION,
            host,
            pid,
            unix_ns: 0,
            source,
            mode,
            extra: Vec::new(),
        }
    }

    /// The whole header, magic included.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let ops: Vec<String> = crate::Op::ALL
            .iter()
            .map(|o| format!("{}={}", o.code(), o.name()))
            .collect();
        let pairs = [
            ("host", self.host.clone()),
            ("pid", self.pid.to_string()),
            ("clock.unix_ns", self.unix_ns.to_string()),
            ("source", self.source.clone()),
            ("mode", self.mode.name().to_string()),
            (
                "modes",
                "0=page-cache,1=direct-io,2=writeback-cache".to_string(),
            ),
            ("ops", ops.join(",")),
            (
                "record",
                "op,bits,pid,uid,exe?,ino,path?,target?,offset,size,server_size?,flags,\
                 start_delta,duration,result"
                    .to_string(),
            ),
        ];
        let mut body = Vec::new();
        for (k, v) in pairs
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .chain(self.extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        {
            put_str(&mut body, k.as_bytes());
            put_str(&mut body, v.as_bytes());
        }
        let mut out = Vec::with_capacity(body.len() + 22);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Reads the header off the front of a trace.
    pub(crate) fn read(src: &mut impl std::io::Read) -> Result<(Header, u64), Error> {
        use std::io::Read;
        let mut fixed = [0u8; 22];
        read_full(src, &mut fixed, "cut short")?;
        if fixed[..8] != MAGIC {
            return Err(Error::NotATrace);
        }
        let version = u16::from_le_bytes([fixed[8], fixed[9]]);
        if version > VERSION {
            return Err(Error::Version(version));
        }
        let len = u32::from_le_bytes(fixed[10..14].try_into().unwrap_or_default()) as usize;
        let sum = u64::from_le_bytes(fixed[14..22].try_into().unwrap_or_default());
        // Grown as bytes come: a damaged length costs no more than the file holds.
        let mut body = Vec::new();
        src.take(len as u64).read_to_end(&mut body)?;
        if body.len() < len {
            return Err(Error::Header("cut short"));
        }
        if xxhash_rust::xxh3::xxh3_64(&body) != sum {
            return Err(Error::Header("checksum mismatch"));
        }
        let mut h = Header::new(String::new(), 0, String::new(), Mode::PageCache);
        h.version = version;
        let mut c = Cursor::new(&body);
        while !c.done() {
            let (Some(k), Some(v)) = (c.bytes(), c.bytes()) else {
                return Err(Error::Header("malformed key/value pairs"));
            };
            let (k, v) = (
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            );
            match k.as_str() {
                "host" => h.host = v,
                "pid" => h.pid = v.parse().map_err(|_| Error::Header("pid"))?,
                "clock.unix_ns" => h.unix_ns = v.parse().map_err(|_| Error::Header("clock"))?,
                "source" => h.source = v,
                "mode" => h.mode = Mode::from_name(&v).unwrap_or_default(),
                // Descriptions of the format, for readers without this crate.
                "modes" | "ops" | "record" => {}
                _ => h.extra.push((k, v)),
            }
        }
        Ok((h, (22 + len) as u64))
    }
}

/// `read_exact`, with a short read reported as a header cut short.
fn read_full(src: &mut impl std::io::Read, buf: &mut [u8], why: &'static str) -> Result<(), Error> {
    match src.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::Header(why)),
        Err(e) => Err(e.into()),
    }
}
