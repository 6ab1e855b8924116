//! Length-prefixed frames.
//!
//! ```text
//! offset size field
//!      0    4 body length (u32 LE): bytes after this field
//!      4    8 request id (u64 LE): a response carries its request's id
//!     12    1 kind: 0 request, 1 response, 2 notice (server to subscribed client, id 0)
//!     13    1 flags: 0
//!     14    4 header length (u32 LE)
//!     18    . header: a postcard-encoded `Request` or `Response`
//!      .    . payload: raw bytes (stripe data), the rest of the body
//! ```
//!
//! The payload is read straight into a pooled buffer (or into memory the caller supplied, see
//! `rpc::Sink`) and handed on as `Bytes`: it is never copied again or re-encoded on its way to
//! the store or to the caller.

use crate::pool::BufferPool;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes before the header.
pub const PREFIX_LEN: usize = 18;
const BODY_FIXED: u32 = (PREFIX_LEN - 4) as u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Request = 0,
    Response = 1,
    Notice = 2,
}

/// Size limits enforced on every frame received.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest body accepted.
    pub max_frame: u32,
    /// Largest header accepted.
    pub max_header: u32,
    /// Largest payload accepted (a serving port takes no more than a stripe in a request).
    pub max_payload: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame: tessera_placement::MAX_STRIPE_SIZE + (2 << 20),
            max_header: 1 << 20,
            max_payload: u32::MAX,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: u64, max: u32 },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("undecodable header: {0}")]
    Decode(#[from] postcard::Error),
}

/// One received frame.
#[derive(Debug)]
pub struct Frame {
    pub id: u64,
    pub kind: FrameKind,
    pub header: Vec<u8>,
    pub payload: Bytes,
}

/// The prefix and header of an outgoing frame; the payload is written after it unchanged.
pub fn encode_head(
    id: u64,
    kind: FrameKind,
    header: &[u8],
    payload_len: usize,
) -> Result<Vec<u8>, FrameError> {
    let body = u64::from(BODY_FIXED) + header.len() as u64 + payload_len as u64;
    let body = u32::try_from(body).map_err(|_| FrameError::TooLarge {
        len: body,
        max: u32::MAX,
    })?;
    let mut out = Vec::with_capacity(PREFIX_LEN + header.len());
    out.extend_from_slice(&body.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.push(kind as u8);
    out.push(0);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(header);
    Ok(out)
}

/// The prefix and header of a frame whose payload is still on the socket.
#[derive(Debug)]
pub struct Head {
    pub id: u64,
    pub kind: FrameKind,
    pub header: Vec<u8>,
    pub payload_len: usize,
}

/// Reads one frame. `Ok(None)` means the peer closed the connection between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: Limits,
    pool: &BufferPool,
) -> Result<Option<Frame>, FrameError> {
    let Some(head) = read_head(r, limits).await? else {
        return Ok(None);
    };
    let payload = read_payload(r, head.payload_len, pool).await?;
    Ok(Some(Frame {
        id: head.id,
        kind: head.kind,
        header: head.header,
        payload,
    }))
}

/// Reads a frame's prefix and header, checked against `limits`; the caller then reads its
/// payload (`read_payload`, or `read_full` into memory of its own). `Ok(None)`: closed between frames.
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: Limits,
) -> Result<Option<Head>, FrameError> {
    let mut prefix = [0u8; PREFIX_LEN];
    // Distinguish a clean close (no byte of a new frame) from a truncated one.
    let first = r.read(&mut prefix).await?;
    if first == 0 {
        return Ok(None);
    }
    read_full(r, &mut prefix[first..]).await?;
    let mut head = parse_prefix(&prefix, limits)?;
    read_full(r, &mut head.header).await?;
    Ok(Some(head))
}

/// Checks a frame's prefix against `limits`: the `Head` it announces, with a header of the
/// announced length still to be filled in.
pub fn parse_prefix(prefix: &[u8; PREFIX_LEN], limits: Limits) -> Result<Head, FrameError> {
    let body = u32::from_le_bytes(prefix[0..4].try_into().expect("4 bytes"));
    let id = u64::from_le_bytes(prefix[4..12].try_into().expect("8 bytes"));
    let kind = match prefix[12] {
        0 => FrameKind::Request,
        1 => FrameKind::Response,
        2 => FrameKind::Notice,
        k => return Err(FrameError::Malformed(format!("unknown frame kind {k}"))),
    };
    if prefix[13] != 0 {
        return Err(FrameError::Malformed(format!(
            "unknown flags {:#x}",
            prefix[13]
        )));
    }
    let header_len = u32::from_le_bytes(prefix[14..18].try_into().expect("4 bytes"));
    if body > limits.max_frame {
        return Err(FrameError::TooLarge {
            len: u64::from(body),
            max: limits.max_frame,
        });
    }
    if body < BODY_FIXED || header_len > body - BODY_FIXED {
        return Err(FrameError::Malformed(format!(
            "header of {header_len} bytes in a body of {body}"
        )));
    }
    if header_len > limits.max_header {
        return Err(FrameError::TooLarge {
            len: u64::from(header_len),
            max: limits.max_header,
        });
    }
    let payload_len = body - BODY_FIXED - header_len;
    if payload_len > limits.max_payload {
        return Err(FrameError::TooLarge {
            len: u64::from(payload_len),
            max: limits.max_payload,
        });
    }
    Ok(Head {
        id,
        kind,
        header: vec![0u8; header_len as usize],
        payload_len: payload_len as usize,
    })
}

/// Reads a payload of `len` bytes into a pooled buffer.
pub async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    pool: &BufferPool,
) -> Result<Bytes, FrameError> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    let mut buf = pool.get(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        if (&mut *r).take(want).read_buf(&mut buf).await? == 0 {
            return Err(FrameError::Truncated);
        }
    }
    Ok(buf.freeze())
}

/// Reads exactly `buf.len()` bytes (a payload received into memory the caller supplied).
pub(crate) async fn read_full<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
) -> Result<(), FrameError> {
    match r.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FrameError::Truncated),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame_bytes(id: u64, kind: FrameKind, header: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut v = encode_head(id, kind, header, payload.len()).unwrap();
        v.extend_from_slice(payload);
        v
    }

    async fn read_all(bytes: &[u8]) -> Result<Vec<Frame>, FrameError> {
        let pool = BufferPool::new(64, 4);
        let mut r = bytes;
        let mut out = Vec::new();
        while let Some(f) = read_frame(&mut r, Limits::default(), &pool).await? {
            out.push(f);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn round_trip_and_clean_eof() {
        let mut wire = frame_bytes(7, FrameKind::Request, b"hdr", b"payload bytes");
        wire.extend(frame_bytes(8, FrameKind::Response, b"", b""));
        let frames = read_all(&wire).await.unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!((frames[0].id, frames[0].kind), (7, FrameKind::Request));
        assert_eq!(frames[0].header, b"hdr");
        assert_eq!(&frames[0].payload[..], b"payload bytes");
        assert_eq!((frames[1].id, frames[1].kind), (8, FrameKind::Response));
        assert!(frames[1].payload.is_empty());
    }

    #[tokio::test]
    async fn malformed_frames_are_errors() {
        let good = frame_bytes(1, FrameKind::Request, b"h", b"data");
        // Every strict prefix of a frame is a truncated frame, never a panic or a hang.
        for cut in 1..good.len() {
            assert!(
                matches!(read_all(&good[..cut]).await, Err(FrameError::Truncated)),
                "cut {cut}"
            );
        }
        let mut bad_kind = good.clone();
        bad_kind[12] = 9;
        assert!(matches!(
            read_all(&bad_kind).await,
            Err(FrameError::Malformed(_))
        ));
        let mut bad_hdr = good.clone();
        bad_hdr[14..18].copy_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(
            read_all(&bad_hdr).await,
            Err(FrameError::Malformed(_))
        ));
        let mut huge = good.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_all(&huge).await,
            Err(FrameError::TooLarge { .. })
        ));
        let mut short_body = good.clone();
        short_body[0..4].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            read_all(&short_body).await,
            Err(FrameError::Malformed(_))
        ));
        // A payload over its own limit is refused from the prefix, before it is read.
        let limits = Limits {
            max_payload: 3,
            ..Limits::default()
        };
        let prefix: &[u8; PREFIX_LEN] = good[..PREFIX_LEN].try_into().unwrap();
        assert!(matches!(
            parse_prefix(prefix, limits),
            Err(FrameError::TooLarge { len: 4, max: 3 })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let _ = rt.block_on(read_all(&bytes));
        }

        #[test]
        fn frames_round_trip(id in any::<u64>(), header in prop::collection::vec(any::<u8>(), 0..300),
                             payload in prop::collection::vec(any::<u8>(), 0..3000)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let frames = rt.block_on(read_all(&frame_bytes(id, FrameKind::Response, &header, &payload))).unwrap();
            prop_assert_eq!(frames.len(), 1);
            prop_assert_eq!(frames[0].id, id);
            prop_assert_eq!(&frames[0].header, &header);
            prop_assert_eq!(&frames[0].payload[..], &payload[..]);
        }
    }
}
