//! Traces written by the writer read back as written; cut at any byte, they read up to their
//! last whole chunk; records with no room are counted in gaps.

use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use tessera_trace::{Error, Event, Header, Item, Mode, Op, Options, Reader, Record, Writer};

const NAMES: &[&str] = &[
    "/",
    "/a",
    "/data/run-1/out.bin",
    "dd",
    "python3",
    "/é/ü",
    "",
];

#[derive(Debug, Clone)]
struct Spec {
    op: u8,
    mode: u8,
    via: bool,
    pid: u32,
    uid: u32,
    exe: Option<usize>,
    ino: u64,
    path: Option<usize>,
    target: Option<usize>,
    offset: u64,
    size: u64,
    server: Option<u64>,
    flags: u32,
    start: u64,
    dur: u64,
    result: i64,
    /// Flush (end the chunk) after this record.
    flush: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    let name = proptest::option::of(0..NAMES.len());
    (
        (
            0..Op::ALL.len() as u8,
            0..4u8,
            any::<bool>(),
            any::<u32>(),
            any::<u32>(),
        ),
        (name.clone(), any::<u64>(), name.clone(), name),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
            any::<u32>(),
        ),
        (
            0..u64::MAX / 2,
            0..u64::MAX / 4,
            any::<i64>(),
            any::<bool>(),
        ),
    )
        .prop_map(|(a, b, c, d)| Spec {
            op: a.0,
            mode: a.1,
            via: a.2,
            pid: a.3,
            uid: a.4,
            exe: b.0,
            ino: b.1,
            path: b.2,
            target: b.3,
            offset: c.0,
            size: c.1,
            server: c.2,
            flags: c.3,
            start: d.0,
            dur: d.1,
            result: d.2,
            flush: d.3,
        })
}

fn mode(m: u8) -> Mode {
    [
        Mode::PageCache,
        Mode::DirectIo,
        Mode::WritebackCache,
        Mode::Library,
    ][m as usize]
}

fn event(s: &Spec) -> Event<'static> {
    let name = |i: Option<usize>| i.map(|i| NAMES[i].as_bytes());
    Event {
        op: Op::ALL[s.op as usize],
        mode: mode(s.mode),
        via_handle: s.via,
        pid: s.pid,
        uid: s.uid,
        exe: name(s.exe),
        ino: s.ino,
        path: name(s.path),
        target: name(s.target),
        offset: s.offset,
        size: s.size,
        server_size: s.server,
        flags: s.flags,
        start_ns: s.start,
        end_ns: s.start + s.dur,
        result: s.result,
    }
}

fn expected(s: &Spec) -> Record {
    let name = |i: Option<usize>| i.map(|i| Arc::<str>::from(NAMES[i]));
    Record {
        op: Op::ALL[s.op as usize],
        mode: mode(s.mode),
        via_handle: s.via,
        pid: s.pid,
        uid: s.uid,
        exe: name(s.exe),
        ino: s.ino,
        path: name(s.path),
        target: name(s.target),
        offset: s.offset,
        size: s.size,
        server_size: s.server,
        flags: s.flags,
        start_ns: s.start,
        end_ns: s.start + s.dur,
        result: s.result,
    }
}

fn header() -> Header {
    Header::new("host-1".into(), 42, "test".into(), Mode::DirectIo)
}

/// Writes `specs` to a new trace (a chunk ends after each spec with `flush`); its bytes.
fn write(specs: &[Spec], opts: &Options) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.ttrace");
    let w = Writer::create(&path, &header(), opts).unwrap();
    for s in specs {
        assert!(w.push(&event(s)));
        if s.flush {
            w.flush();
        }
    }
    let stats = w.finish();
    assert_eq!(stats.records, specs.len() as u64);
    std::fs::read(&path).unwrap()
}

fn read_all(bytes: &[u8]) -> Result<(Vec<Item>, bool), Error> {
    let mut r = Reader::new(bytes)?;
    let items = r.by_ref().collect::<Result<Vec<_>, _>>()?;
    Ok((items, r.torn()))
}

fn records(items: &[Item]) -> Vec<Record> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Record(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn round_trip(specs in proptest::collection::vec(spec(), 0..60), strings in 1usize..64) {
        // A small string budget makes the writer forget and define strings again.
        let opts = Options { strings_bytes: strings, ..Options::default() };
        let bytes = write(&specs, &opts);
        let mut r = Reader::new(&bytes[..]).unwrap();
        // The writer sets the clock: time 0 is when it was created.
        let mut expected_header = header();
        expected_header.unix_ns = r.header().unix_ns;
        prop_assert!(expected_header.unix_ns > 1_600_000_000_000_000_000);
        prop_assert_eq!(r.header(), &expected_header);
        let items: Vec<Item> = r.by_ref().map(Result::unwrap).collect();
        prop_assert!(!r.torn());
        prop_assert_eq!(records(&items), specs.iter().map(expected).collect::<Vec<_>>());
        prop_assert_eq!(
            items.last(),
            Some(&Item::End { records: specs.len() as u64, dropped: 0 })
        );
    }

    #[test]
    fn cut_anywhere(specs in proptest::collection::vec(spec(), 1..8)) {
        let bytes = write(&specs, &Options::default());
        // Where each record's chunk ends: it is read from a cut at or past that.
        let mut r = Reader::new(&bytes[..]).unwrap();
        let header_len = r.valid_bytes() as usize;
        let mut ends = Vec::new();
        let mut chunk_ends = vec![header_len];
        while let Some(item) = r.next_item().unwrap() {
            chunk_ends.push(r.valid_bytes() as usize);
            if let Item::Record(_) = item {
                ends.push(r.valid_bytes() as usize);
            }
        }
        prop_assert_eq!(r.valid_bytes() as usize, bytes.len());
        let all = specs.iter().map(expected).collect::<Vec<_>>();
        for cut in 0..=bytes.len() {
            match read_all(&bytes[..cut]) {
                Err(Error::Header(_)) => prop_assert!(cut < header_len),
                Err(e) => prop_assert!(false, "cut at {}: {}", cut, e),
                Ok((items, torn)) => {
                    let kept = ends.iter().filter(|&&end| end <= cut).count();
                    prop_assert_eq!(records(&items), all[..kept].to_vec(), "cut at {}", cut);
                    prop_assert_eq!(torn, !chunk_ends.contains(&cut), "cut at {}", cut);
                }
            }
        }
    }
}

#[test]
fn damaged_chunk_ends_the_trace() {
    let specs: Vec<Spec> = (0..3)
        .map(|i| Spec {
            op: 14,
            mode: 0,
            via: false,
            pid: 7,
            uid: 0,
            exe: Some(3),
            ino: 9,
            path: Some(2),
            target: None,
            offset: i * 4096,
            size: 4096,
            server: None,
            flags: 0,
            start: i * 1000,
            dur: 10,
            result: 4096,
            flush: true,
        })
        .collect();
    let mut bytes = write(&specs, &Options::default());
    // A byte of the second record's chunk flipped: the first record stays, the rest is gone.
    let mut r = Reader::new(&bytes[..]).unwrap();
    r.next_item().unwrap();
    let first_end = r.valid_bytes() as usize;
    bytes[first_end + 20] ^= 0xff;
    let (items, torn) = read_all(&bytes).unwrap();
    assert!(torn);
    assert_eq!(records(&items), vec![expected(&specs[0])]);
}

#[test]
fn a_full_buffer_is_a_counted_gap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.ttrace");
    let opts = Options {
        buffer_bytes: 1024,
        flush_every: Duration::from_secs(3600),
        ..Options::default()
    };
    let w = Writer::create(&path, &header(), &opts).unwrap();
    let mut kept = 0u64;
    for i in 0..10_000u64 {
        let mut e = Event::new(Op::Write);
        e.path = Some(b"/f");
        e.offset = i * 65536;
        e.size = 65536;
        e.start_ns = i;
        e.end_ns = i + 1;
        kept += u64::from(w.push(&e));
    }
    let stats = w.finish();
    assert_eq!((stats.records, stats.dropped), (kept, 10_000 - kept));
    assert!(stats.dropped > 0, "a 1 KiB buffer held 10,000 records");
    let (items, torn) = read_all(&std::fs::read(&path).unwrap()).unwrap();
    assert!(!torn);
    let gaps: u64 = items
        .iter()
        .map(|i| match i {
            Item::Gap(g) => g.dropped,
            _ => 0,
        })
        .sum();
    assert_eq!(records(&items).len() as u64, kept);
    assert_eq!(gaps, 10_000 - kept);
    assert_eq!(
        items.last(),
        Some(&Item::End {
            records: kept,
            dropped: 10_000 - kept
        })
    );
    // Every offset is either recorded or inside a gap: recorded ones are in order.
    let offsets: Vec<u64> = records(&items).iter().map(|r| r.offset).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn damaged_lengths_are_refused_without_allocating_them() {
    let mut bytes = write(&[], &Options::default());
    // A header length of 4 GiB: refused as cut short.
    let mut head = bytes.clone();
    head[10..14].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(Reader::new(&head[..]), Err(Error::Header(_))));
    // A chunk length of 4 GiB: the trace ends, torn, before it.
    let header_len = Reader::new(&bytes[..]).unwrap().valid_bytes() as usize;
    bytes[header_len + 4..header_len + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let (items, torn) = read_all(&bytes).unwrap();
    assert!(items.is_empty() && torn);
    // Not a trace at all.
    assert!(matches!(
        Reader::new(&b"hello world, not a trace"[..]),
        Err(Error::NotATrace)
    ));
}
