//! Cutting a byte range of a file into per-stripe pieces.

/// One piece of a file range that falls inside a single stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Stripe index within the file.
    pub stripe: u64,
    /// Offset of the piece inside the stripe.
    pub offset: u32,
    /// Length of the piece.
    pub len: u32,
    /// Offset of the piece inside the caller's buffer.
    pub buf_offset: usize,
}

/// The stripe pieces covering `len` bytes at file offset `offset`, in file order.
pub fn segments(offset: u64, len: usize, stripe_size: u32) -> impl Iterator<Item = Segment> {
    assert!(stripe_size > 0);
    let ss = u64::from(stripe_size);
    let mut pos = offset;
    let end = offset.saturating_add(len as u64);
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let stripe = pos / ss;
        let in_stripe = pos % ss;
        let take = (ss - in_stripe).min(end - pos);
        let seg = Segment {
            stripe,
            offset: in_stripe as u32,
            len: take as u32,
            buf_offset: (pos - offset) as usize,
        };
        pos += take;
        Some(seg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn boundaries() {
        let s: Vec<_> = segments(10, 30, 16).collect();
        assert_eq!(
            s,
            vec![
                Segment {
                    stripe: 0,
                    offset: 10,
                    len: 6,
                    buf_offset: 0
                },
                Segment {
                    stripe: 1,
                    offset: 0,
                    len: 16,
                    buf_offset: 6
                },
                Segment {
                    stripe: 2,
                    offset: 0,
                    len: 8,
                    buf_offset: 22
                },
            ]
        );
        assert_eq!(segments(5, 0, 16).count(), 0);
    }

    proptest! {
        #[test]
        fn pieces_tile_the_range(off in 0u64..1 << 40, len in 0usize..1 << 24, ss_mib in 1u32..8) {
            let ss = ss_mib << 20;
            let mut expect_buf = 0usize;
            for seg in segments(off, len, ss) {
                prop_assert_eq!(seg.buf_offset, expect_buf);
                prop_assert!(seg.len > 0 && u64::from(seg.offset) + u64::from(seg.len) <= u64::from(ss));
                prop_assert_eq!(seg.stripe * u64::from(ss) + u64::from(seg.offset), off + expect_buf as u64);
                expect_buf += seg.len as usize;
            }
            prop_assert_eq!(expect_buf, len);
        }
    }
}
