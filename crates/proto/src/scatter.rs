//! Scatter writes ([`crate::Op::WriteScatter`]): many pieces of one stripe in one request. A
//! writer whose bytes interleave with other writers' (records placed by key) cannot cover the
//! bytes between its pieces, which are another's; one request per piece would make every
//! small record a round trip of its own.

use crate::msg::ErrorCode;
use serde::{Deserialize, Serialize};

/// One piece of a scatter write: `len` bytes at `offset` of the stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub offset: u32,
    pub len: u32,
}

impl Piece {
    /// The stripe offset just past the piece.
    #[must_use]
    pub fn end(&self) -> u64 {
        u64::from(self.offset) + u64::from(self.len)
    }
}

/// Most pieces one scatter write carries. Encoded, a piece takes at most 10 bytes, so the
/// request's header stays under the frame's header limit (`Limits::max_header`, 1 MiB); a
/// client cuts a stripe with more pieces into several requests.
pub const SCATTER_PIECES_MAX: usize = 1 << 16;

fn invalid(why: String) -> ErrorCode {
    ErrorCode::Invalid(format!("scatter write: {why}"))
}

/// Checks the pieces of a scatter write to a stripe of `stripe_size` bytes whose payload is
/// `payload` bytes: 1 to [`SCATTER_PIECES_MAX`] pieces, none empty, in increasing offset order
/// and not overlapping, all inside the stripe, their lengths adding up to the payload's (so the
/// payload is at most a stripe). Gives the end of the last piece.
pub fn check_pieces(pieces: &[Piece], stripe_size: u32, payload: usize) -> Result<u32, ErrorCode> {
    if pieces.is_empty() {
        return Err(invalid("no piece".into()));
    }
    if pieces.len() > SCATTER_PIECES_MAX {
        return Err(invalid(format!(
            "{} pieces, more than the {SCATTER_PIECES_MAX} one request may carry",
            pieces.len()
        )));
    }
    let mut end = 0u64;
    let mut total = 0u64;
    for (i, p) in pieces.iter().enumerate() {
        if p.len == 0 {
            return Err(invalid(format!("piece {i} is empty")));
        }
        if i > 0 && u64::from(p.offset) < end {
            return Err(invalid(format!(
                "piece {i} at {} starts before the end of the one before it ({end}): pieces \
                 must be in increasing offset order and must not overlap",
                p.offset
            )));
        }
        end = p.end();
        if end > u64::from(stripe_size) {
            return Err(invalid(format!(
                "piece {i} ({}+{}) crosses the stripe end ({stripe_size})",
                p.offset, p.len
            )));
        }
        total += u64::from(p.len);
    }
    if total != payload as u64 {
        return Err(invalid(format!(
            "the pieces hold {total} bytes, the payload {payload}"
        )));
    }
    // Within the stripe, which fits a u32.
    Ok(end as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Op, Request};
    use proptest::prelude::*;

    fn p(offset: u32, len: u32) -> Piece {
        Piece { offset, len }
    }

    #[test]
    fn good_pieces_give_their_end() {
        assert_eq!(check_pieces(&[p(0, 4)], 16, 4), Ok(4));
        // Touching pieces are fine: they do not overlap.
        assert_eq!(check_pieces(&[p(2, 3), p(5, 1), p(10, 6)], 16, 10), Ok(16));
    }

    #[test]
    fn malformed_pieces_are_refused_with_the_reason() {
        let cases: [(&[Piece], usize, &str); 7] = [
            (&[], 0, "no piece"),
            (&[p(0, 4), p(0, 0)], 4, "piece 1 is empty"),
            (&[p(4, 4), p(0, 4)], 8, "increasing offset order"),
            (&[p(0, 4), p(3, 4)], 8, "must not overlap"),
            (&[p(0, 4), p(14, 4)], 8, "crosses the stripe end"),
            (&[p(u32::MAX, 1)], 1, "crosses the stripe end"),
            (&[p(0, 4), p(8, 4)], 9, "hold 8 bytes, the payload 9"),
        ];
        for (pieces, payload, why) in cases {
            match check_pieces(pieces, 16, payload) {
                Err(ErrorCode::Invalid(m)) => assert!(m.contains(why), "{m:?}, not {why:?}"),
                other => panic!("{pieces:?}: {other:?}"),
            }
        }
        let many = vec![p(0, 1); SCATTER_PIECES_MAX + 1];
        let e = check_pieces(&many, 1 << 20, many.len()).unwrap_err();
        assert!(e.to_string().contains("pieces, more than"), "{e}");
    }

    #[test]
    fn the_most_pieces_fit_a_header() {
        let pieces = vec![p(u32::MAX, u32::MAX); SCATTER_PIECES_MAX];
        let req = Request::Op {
            epoch: u64::MAX,
            op: Op::WriteScatter {
                file: u64::MAX,
                stripe: u64::MAX,
                pieces,
            },
        };
        let len = postcard::to_allocvec(&req).unwrap().len();
        assert!(len < crate::Limits::default().max_header as usize, "{len}");
    }

    fn pieces() -> impl Strategy<Value = Vec<Piece>> {
        prop::collection::vec((0u32..64, 1u32..64), 1..40).prop_map(|gaps| {
            let mut at = 0;
            gaps.into_iter()
                .map(|(gap, len)| {
                    let piece = p(at + gap, len);
                    at = piece.offset + len;
                    piece
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn scatter_writes_round_trip(
            file in any::<u64>(), stripe in any::<u64>(), epoch in any::<u64>(),
            pieces in pieces(),
        ) {
            let req = Request::Op { epoch, op: Op::WriteScatter { file, stripe, pieces } };
            let back: Request = postcard::from_bytes(&postcard::to_allocvec(&req).unwrap()).unwrap();
            prop_assert_eq!(back, req);
        }

        /// Pieces made in order are accepted; moving one to overlap its neighbour, or a
        /// payload of another length, is refused.
        #[test]
        fn only_ordered_disjoint_pieces_matching_the_payload_pass(
            pieces in pieces(), at in any::<prop::sample::Index>(), off in 1u32..64,
        ) {
            let total: usize = pieces.iter().map(|p| p.len as usize).sum();
            let end = pieces.last().unwrap().end() as u32;
            prop_assert_eq!(check_pieces(&pieces, 4096, total), Ok(end));
            prop_assert!(check_pieces(&pieces, 4096, total + 1).is_err());
            prop_assert!(check_pieces(&pieces, end - 1, total).is_err());
            if pieces.len() > 1 {
                let i = at.index(pieces.len() - 1) + 1;
                let mut bad = pieces.clone();
                let before = bad[i - 1].end() as u32;
                bad[i].offset = before.saturating_sub(off);
                prop_assert!(check_pieces(&bad, 4096, total).is_err());
            }
        }
    }
}
