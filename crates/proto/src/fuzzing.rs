//! Entry points for fuzzing the decoders of what arrives from the network: the frame prefix
//! and header, the postcard-encoded messages, the handshake, and the partition table. The
//! cargo-fuzz targets (`fuzz/` at the workspace root) and this module's property tests feed
//! them arbitrary bytes. Whatever the bytes, each decoder must give an error or a value (one
//! that holds its type's invariants, and encodes back to itself), never panic.

use crate::auth::{client_handshake, server_handshake};
use crate::frame::{read_frame, FrameKind, Limits};
use crate::{check_name, BufferPool, Notice, Op, Request, Response, Secret, TableInfo};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use tessera_placement::{meta_partition, stripe_partition, PartitionTable};

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
        .block_on(f)
}

/// Decodes `data` as a `T`; a value decoded must encode back to bytes that decode to it.
fn decode<T: Serialize + DeserializeOwned + PartialEq + Debug>(data: &[u8]) -> Option<T> {
    let value: T = postcard::from_bytes(data).ok()?;
    let again = postcard::to_allocvec(&value).expect("a decoded value encodes");
    assert_eq!(
        postcard::from_bytes::<T>(&again).ok().as_ref(),
        Some(&value),
        "re-encoded differently"
    );
    Some(value)
}

/// A stream of frames, as a server or client reads them, each header decoded by its kind.
pub fn frames(data: &[u8]) {
    block_on(async {
        let pool = BufferPool::new(64, 4);
        let mut r = data;
        while let Ok(Some(f)) = read_frame(&mut r, Limits::default(), &pool).await {
            match f.kind {
                FrameKind::Request => request(&f.header),
                FrameKind::Response => response(&f.header),
                FrameKind::Notice => drop(decode::<Notice>(&f.header)),
            }
        }
    });
}

/// A header decoded as each message type.
pub fn messages(data: &[u8]) {
    request(data);
    response(data);
    let _ = decode::<Notice>(data);
}

fn request(data: &[u8]) {
    if let Some(Request::Op { op, .. } | Request::Replica { op, .. }) = decode(data) {
        route(&op);
    }
}

/// What a server does with an operation before its store sees it: the partition of its key,
/// and its names checked.
fn route(op: &Op) {
    for partitions in [1, 7, 1024] {
        if let Some(p) = op.partition(partitions) {
            // Named by the sender; the server refuses one it does not have.
            if !matches!(op, Op::SyncPull { .. } | Op::InodeScan { .. }) {
                assert!(
                    p < partitions,
                    "{op:?} routed to partition {p} of {partitions}"
                );
            }
        }
    }
    if let Op::DirInsert { name, .. } | Op::DirCreate { name, .. } | Op::DirLookup { name, .. } = op
    {
        let _ = check_name(name);
    }
}

fn response(data: &[u8]) {
    if let Some(Response::Table(info)) = decode::<Response>(data) {
        table_info(&info);
    }
}

/// The handshake, on both sides, with a peer that sends `data`.
pub fn handshake(data: &[u8]) {
    let secret = Secret::new("fuzz");
    block_on(async {
        let mut peer = tokio::io::join(data, tokio::io::sink());
        let _ = server_handshake(&mut peer, &secret).await;
        let mut peer = tokio::io::join(data, tokio::io::sink());
        let _ = client_handshake(&mut peer, &secret).await;
    });
}

/// A partition table, alone or with its cluster's settings, decoded and then used as a
/// server or client uses one.
pub fn table(data: &[u8]) {
    if let Some(t) = decode::<PartitionTable>(data) {
        partition_table(&t);
    }
    if let Some(info) = decode::<TableInfo>(data) {
        table_info(&info);
    }
}

fn table_info(info: &TableInfo) {
    partition_table(&info.table);
    let fits = info.check(info.config.partitions);
    assert!(
        fits.is_ok(),
        "a decoded table is not one to install: {fits:?}"
    );
    let partitions = info.config.partitions;
    for key in [0, 1, u64::MAX, 1 << 62, 12_345] {
        let p = meta_partition(key, partitions);
        let _ = (info.table.replicas(p), info.table.primary(p));
        let _ = info.table.replicas(stripe_partition(key, key, partitions));
    }
}

fn partition_table(t: &PartitionTable) {
    for p in 0..t.partitions() {
        let _ = (t.replicas(p), t.incoming(p), t.changed(p), t.primary(p));
        for n in t.replicas(p).iter().chain(t.incoming(p)) {
            assert!(t.holds(*n, p) || t.receives(*n, p));
        }
    }
    let _ = (t.nodes(), t.load(), t.copies_incoming(), t.moves_from(t));
    let _ = (t.lost().count(), t.degraded(3).count());
    if t.epoch() < u64::MAX {
        let same = t.next(t.all().to_vec(), t.all_incoming().to_vec());
        assert!(same.is_ok(), "a decoded table is not a valid one: {same:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_head;
    use crate::{
        ClusterConfig, DirEntry, ErrorCode, FileKind, Inode, NodeAddr, SetAttr, SyncItem, Timespec,
    };
    use proptest::prelude::*;

    fn inode() -> Inode {
        Inode::new(5, FileKind::Symlink, 0o777, 1, 2, 0, b"/x".to_vec())
    }

    fn info() -> TableInfo {
        let table = PartitionTable::new(3, vec![vec![1, 2], vec![2, 3], vec![3, 1]]).unwrap();
        let table = table
            .next(
                vec![vec![1], vec![2, 3], vec![3, 1]],
                vec![vec![2], vec![], vec![]],
            )
            .unwrap();
        TableInfo {
            config: ClusterConfig::new(3, 1 << 20, 2),
            table,
            nodes: (1..=3)
                .map(|id| NodeAddr {
                    id,
                    addr: std::net::SocketAddr::from(([127, 0, 0, 1 + id as u8], 7000)),
                })
                .collect(),
        }
    }

    /// A valid encoding of each sort of message, to mutate.
    fn samples() -> Vec<Vec<u8>> {
        let t = Timespec { secs: 7, nanos: 9 };
        let ops = vec![
            Op::WriteStripe {
                file: 3,
                stripe: 4,
                offset: 5,
            },
            Op::WriteScatter {
                file: 3,
                stripe: 4,
                pieces: vec![
                    crate::Piece { offset: 0, len: 7 },
                    crate::Piece {
                        offset: 100,
                        len: 3,
                    },
                ],
            },
            Op::InodeCreate { inode: inode() },
            Op::InodeReserve {
                ino: 9,
                len: 1 << 40,
                mtime: t,
            },
            Op::InodeSetAttr {
                ino: 9,
                attr: SetAttr {
                    mode: Some(0o644),
                    parent: Some(4),
                    ctime: t,
                    ..SetAttr::default()
                },
            },
            Op::DirInsert {
                dir: 1,
                name: b"name".to_vec(),
                entry: DirEntry {
                    ino: 6,
                    kind: FileKind::CharDevice(3),
                },
                replace: true,
                mtime: t,
            },
            Op::DirList {
                dir: 1,
                after: Some(b"a".to_vec()),
                limit: 10,
            },
            Op::DropFiles { files: vec![1, 3] },
            Op::SyncPull {
                partition: 2,
                node: 1,
                round: 0,
                from: 0,
                fence: true,
            },
        ];
        let mut out: Vec<Vec<u8>> = ops
            .into_iter()
            .map(|op| postcard::to_allocvec(&Request::Op { epoch: 4, op }).unwrap())
            .collect();
        let responses = [
            Response::Inode(inode()),
            Response::Table(info()),
            Response::Error(ErrorCode::StaleEpoch { current: 9 }),
            Response::SyncPage {
                items: vec![
                    SyncItem::Stripe {
                        file: 1,
                        index: 2,
                        len: 3,
                    },
                    SyncItem::Entry {
                        dir: 1,
                        name: b"x".to_vec(),
                        entry: DirEntry {
                            ino: 2,
                            kind: FileKind::Dir,
                        },
                    },
                ],
                next: Some(5),
            },
        ];
        out.extend(responses.iter().map(|r| postcard::to_allocvec(r).unwrap()));
        out.push(
            postcard::to_allocvec(&Notice::Entry {
                dir: 1,
                name: b"n".to_vec(),
            })
            .unwrap(),
        );
        out.push(postcard::to_allocvec(&info()).unwrap());
        out.push(postcard::to_allocvec(&info().table).unwrap());
        out
    }

    /// Each sample as a frame of each kind, with a payload.
    fn framed() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (k, header) in samples().iter().enumerate() {
            let kind = [FrameKind::Request, FrameKind::Response, FrameKind::Notice][k % 3];
            let mut f = encode_head(k as u64, kind, header, 3).unwrap();
            f.extend_from_slice(b"abc");
            out.push(f);
        }
        out
    }

    #[derive(Debug, Clone)]
    enum Mutation {
        Set(usize, u8),
        Flip(usize, u8),
        Cut(usize),
        Insert(usize, Vec<u8>),
        Remove(usize, usize),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
            (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
            any::<usize>().prop_map(Mutation::Cut),
            (any::<usize>(), prop::collection::vec(any::<u8>(), 1..9))
                .prop_map(|(i, b)| Mutation::Insert(i, b)),
            (any::<usize>(), 1usize..9).prop_map(|(i, n)| Mutation::Remove(i, n)),
        ]
    }

    fn mutate(mut v: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
        for m in ms {
            let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
            match m {
                Mutation::Set(i, b) if !v.is_empty() => {
                    let i = at(*i, v.len());
                    v[i] = *b;
                }
                Mutation::Flip(i, bit) if !v.is_empty() => {
                    let i = at(*i, v.len());
                    v[i] ^= 1 << bit;
                }
                Mutation::Cut(i) => v.truncate(at(*i, v.len() + 1)),
                Mutation::Insert(i, b) => {
                    let i = at(*i, v.len() + 1);
                    v.splice(i..i, b.iter().copied());
                }
                Mutation::Remove(i, n) if !v.is_empty() => {
                    let i = at(*i, v.len());
                    v.drain(i..(i + n).min(v.len()));
                }
                _ => {}
            }
        }
        v
    }

    #[test]
    fn the_samples_decode() {
        for s in samples() {
            assert!(
                postcard::from_bytes::<Request>(&s).is_ok()
                    || postcard::from_bytes::<Response>(&s).is_ok()
                    || postcard::from_bytes::<Notice>(&s).is_ok()
                    || postcard::from_bytes::<TableInfo>(&s).is_ok()
                    || postcard::from_bytes::<PartitionTable>(&s).is_ok()
            );
            messages(&s);
            table(&s);
        }
        for f in framed() {
            frames(&f);
        }
    }

    /// A table whose lists disagree in length used to decode, and then panic when used.
    #[test]
    fn a_table_decodes_only_if_it_is_one() {
        #[derive(Serialize)]
        struct Raw {
            epoch: u64,
            replicas: Vec<Vec<u32>>,
            incoming: Vec<Vec<u32>>,
            changed: Vec<u64>,
        }
        let bad = [
            Raw {
                epoch: 3,
                replicas: vec![vec![1], vec![2]],
                incoming: vec![vec![]],
                changed: vec![3, 3],
            },
            Raw {
                epoch: 3,
                replicas: vec![vec![1], vec![2]],
                incoming: vec![vec![], vec![]],
                changed: vec![3],
            },
            Raw {
                epoch: 3,
                replicas: vec![],
                incoming: vec![],
                changed: vec![],
            },
            Raw {
                epoch: 3,
                replicas: vec![vec![1, 1]],
                incoming: vec![vec![]],
                changed: vec![3],
            },
            Raw {
                epoch: 3,
                replicas: vec![vec![1]],
                incoming: vec![vec![]],
                changed: vec![4],
            },
        ];
        for raw in &bad {
            let bytes = postcard::to_allocvec(raw).unwrap();
            assert!(postcard::from_bytes::<PartitionTable>(&bytes).is_err());
            table(&bytes);
        }
        let good = Raw {
            epoch: 3,
            replicas: vec![vec![1], vec![]],
            incoming: vec![vec![2], vec![]],
            changed: vec![2, 3],
        };
        let t: PartitionTable = postcard::from_bytes(&postcard::to_allocvec(&good).unwrap())
            .expect("a lost partition and a copy under way are a table");
        assert_eq!((t.changed(0), t.lost().count()), (2, 1));
    }

    /// Settings of no partition or a stripe of zero bytes used to decode, and then panic (a
    /// division by zero, a hash modulo zero) when used.
    #[test]
    fn cluster_settings_and_tables_decode_only_if_they_fit() {
        let config = |partitions, stripe_size, replication| {
            ClusterConfig::new(partitions, stripe_size, replication)
        };
        for c in [
            config(0, 1 << 20, 1),
            config(4, 0, 1),
            config(4, 1 << 20, 0),
        ] {
            let bytes = postcard::to_allocvec(&c).unwrap();
            assert!(
                postcard::from_bytes::<ClusterConfig>(&bytes).is_err(),
                "{c:?}"
            );
        }
        let mut wrong = info();
        wrong.config.partitions = 4;
        let bytes = postcard::to_allocvec(&wrong).unwrap();
        assert!(postcard::from_bytes::<TableInfo>(&bytes).is_err());
        table(&bytes);
        let bytes = postcard::to_allocvec(&info()).unwrap();
        assert_eq!(postcard::from_bytes::<TableInfo>(&bytes).ok(), Some(info()));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
            frames(&data);
            messages(&data);
            handshake(&data);
            table(&data);
        }

        #[test]
        fn mutated_messages_never_panic(
            k in any::<prop::sample::Index>(),
            ms in prop::collection::vec(mutation(), 1..6),
        ) {
            let samples = samples();
            let data = mutate(samples[k.index(samples.len())].clone(), &ms);
            messages(&data);
            table(&data);
        }

        #[test]
        fn mutated_frames_never_panic(
            k in any::<prop::sample::Index>(),
            ms in prop::collection::vec(mutation(), 1..6),
        ) {
            let framed = framed();
            frames(&mutate(framed[k.index(framed.len())].clone(), &ms));
        }

        #[test]
        fn mutated_handshakes_never_panic(
            version in prop_oneof![Just(crate::PROTOCOL_VERSION), any::<u16>()],
            rest in prop::collection::vec(any::<u8>(), 0..80),
            ms in prop::collection::vec(mutation(), 0..4),
        ) {
            let mut hello = crate::MAGIC.to_vec();
            hello.extend_from_slice(&version.to_le_bytes());
            hello.extend_from_slice(&rest);
            handshake(&mutate(hello, &ms));
        }
    }
}
