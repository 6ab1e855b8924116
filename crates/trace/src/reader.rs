//! The reader: a trace's items in order, up to its last whole chunk.

use crate::format::{Cursor, B_EXE, B_PATH, B_SERVER, B_TARGET, B_VIA, CHUNK_HEAD, CHUNK_MAGIC};
use crate::format::{T_DEF, T_END, T_GAP, T_REC, T_RESET};
use crate::record::{Gap, Mode, Op, Record};
use crate::{Error, Header};
use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// What a trace holds, in the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Record(Record),
    Gap(Gap),
    /// The writer stopped cleanly, having kept `records` and lost `dropped` in all.
    End {
        records: u64,
        dropped: u64,
    },
}

/// Reads a trace. A file cut at any byte, or whose last chunk is torn or damaged, reads up to
/// its last whole chunk: [`Reader::torn`] then says so.
pub struct Reader<R> {
    src: R,
    header: Header,
    strings: Vec<Option<Arc<str>>>,
    items: VecDeque<Item>,
    chunk: Vec<u8>,
    valid: u64,
    torn: bool,
    done: bool,
}

impl Reader<std::io::BufReader<std::fs::File>> {
    pub fn open(path: &Path) -> Result<Self, Error> {
        Reader::new(std::io::BufReader::new(std::fs::File::open(path)?))
    }
}

impl<R: Read> Reader<R> {
    /// Reads the header; an error if there is no whole header.
    pub fn new(mut src: R) -> Result<Self, Error> {
        let (header, valid) = Header::read(&mut src)?;
        Ok(Reader {
            src,
            header,
            strings: Vec::new(),
            items: VecDeque::new(),
            chunk: Vec::new(),
            valid,
            torn: false,
            done: false,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The file ended in a partial or damaged chunk (its writer was killed, or it was cut):
    /// what came before it was read.
    pub fn torn(&self) -> bool {
        self.torn
    }

    /// Bytes of the file read as whole chunks (and header).
    pub fn valid_bytes(&self) -> u64 {
        self.valid
    }

    /// The next item; `None` at the end of the last whole chunk.
    pub fn next_item(&mut self) -> Result<Option<Item>, Error> {
        while self.items.is_empty() && !self.done {
            self.next_chunk()?;
        }
        Ok(self.items.pop_front())
    }

    /// Reads and decodes one chunk into `items`, or ends the trace.
    fn next_chunk(&mut self) -> Result<(), Error> {
        let mut head = [0u8; CHUNK_HEAD];
        let got = read_up_to(&mut self.src, &mut head)?;
        if got < CHUNK_HEAD || head[..4] != CHUNK_MAGIC {
            self.torn = got > 0;
            self.done = true;
            return Ok(());
        }
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let sum = u64::from_le_bytes(head[8..].try_into().unwrap_or_default());
        // Grown as bytes come: a damaged length costs no more than the file holds.
        self.chunk.clear();
        let got = (&mut self.src)
            .take(len as u64)
            .read_to_end(&mut self.chunk)?;
        if got < len || xxhash_rust::xxh3::xxh3_64(&self.chunk) != sum {
            self.torn = true;
            self.done = true;
            return Ok(());
        }
        let chunk = std::mem::take(&mut self.chunk);
        let decoded = self.decode(&chunk);
        self.chunk = chunk;
        match decoded {
            Some(items) => {
                self.items.extend(items);
                self.valid += (CHUNK_HEAD + len) as u64;
            }
            // A checksum that matches bytes that do not decode: damage all the same.
            None => {
                self.torn = true;
                self.done = true;
            }
        }
        Ok(())
    }

    fn decode(&mut self, chunk: &[u8]) -> Option<Vec<Item>> {
        let mut c = Cursor::new(chunk);
        let mut items = Vec::new();
        let mut prev_start = 0u64;
        while !c.done() {
            match c.u8()? {
                T_DEF => {
                    let id = usize::try_from(c.v()?).ok()?;
                    let s: Arc<str> = String::from_utf8_lossy(c.bytes()?).into();
                    if id >= self.strings.len() {
                        // Ids come in order; a jump is refused rather than allocated.
                        if id > self.strings.len() + (1 << 20) {
                            return None;
                        }
                        self.strings.resize(id + 1, None);
                    }
                    self.strings[id] = Some(s);
                }
                T_RESET => self.strings.clear(),
                T_REC => {
                    let r = self.record(&mut c, prev_start)?;
                    prev_start = r.start_ns;
                    items.push(Item::Record(r));
                }
                T_GAP => items.push(Item::Gap(Gap {
                    dropped: c.v()?,
                    from_ns: c.v()?,
                    to_ns: c.v()?,
                })),
                T_END => {
                    items.push(Item::End {
                        records: c.v()?,
                        dropped: c.v()?,
                    });
                }
                _ => return None,
            }
        }
        Some(items)
    }

    fn string(&self, id: u64) -> Option<Arc<str>> {
        self.strings.get(usize::try_from(id).ok()?)?.clone()
    }

    fn record(&self, c: &mut Cursor<'_>, prev_start: u64) -> Option<Record> {
        let op = Op::from_code(c.u8()?);
        let bits = c.u8()?;
        let pid = c.u32v()?;
        let uid = c.u32v()?;
        let exe = if bits & B_EXE != 0 {
            Some(c.v()?)
        } else {
            None
        };
        let ino = c.v()?;
        let path = if bits & B_PATH != 0 {
            Some(c.v()?)
        } else {
            None
        };
        let target = if bits & B_TARGET != 0 {
            Some(c.v()?)
        } else {
            None
        };
        let offset = c.v()?;
        let size = c.v()?;
        let server_size = if bits & B_SERVER != 0 {
            Some(c.v()?)
        } else {
            None
        };
        let flags = c.u32v()?;
        let start_ns = prev_start.wrapping_add(c.z()? as u64);
        let end_ns = start_ns.saturating_add(c.v()?);
        let result = c.z()?;
        Some(Record {
            op,
            mode: Mode::from_code(bits & 3),
            via_handle: bits & B_VIA != 0,
            pid,
            uid,
            exe: exe.and_then(|id| self.string(id)),
            ino,
            path: path.and_then(|id| self.string(id)),
            target: target.and_then(|id| self.string(id)),
            offset,
            size,
            server_size,
            flags,
            start_ns,
            end_ns,
            result,
        })
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Item, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_item().transpose()
    }
}

/// Fills `buf` as far as the source goes; the bytes read.
fn read_up_to(src: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match src.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
