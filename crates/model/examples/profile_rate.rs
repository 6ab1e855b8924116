//! How fast the profiler reads a trace, and that its memory does not grow with the trace:
//! writes a trace of N records (default 10 M) of a made-up workflow (16 processes; files read
//! sequentially, a shared file written strided, random reads, metadata bursts), then reads and
//! profiles it on one thread, printing records per second and the process's peak memory
//! before and after. Run with 1 M and 10 M records to compare the peaks.
//! Run: cargo run --release -p tessera-model --example profile_rate [RECORDS]

use std::time::{Duration, Instant};
use tessera_model::{Limits, Profiler, Source};
use tessera_trace::{Event, Item, Mode, Op, Options, Reader, Writer};

fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let dir = std::env::temp_dir().join(format!("profile-rate-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (path, writer) =
        Writer::create_in(&dir, "example".into(), Mode::Library, &Options::default())?;
    let paths: Vec<String> = (0..64).map(|i| format!("/run/part-{i:03}.bin")).collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut t = 0u64;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let pid = (i / 4096 % 16) as u32 + 100;
        let file = (i / 65536 % 64) as usize;
        let k = i % 4096;
        let (op, offset, size) = match (i / 4096) % 4 {
            0 => (Op::Read, k << 20, 1 << 20),
            1 => (Op::Write, (k * 16 + u64::from(pid % 16)) * 4096, 4096),
            2 => (Op::Read, (x % (1 << 18)) * 4096, 4096),
            _ => (if k % 2 == 0 { Op::Create } else { Op::Getattr }, 0, 0),
        };
        t += 1000;
        writer.push(&Event {
            pid,
            exe: Some(b"worker"),
            ino: file as u64 + 10,
            path: Some(paths[file].as_bytes()),
            offset,
            size,
            start_ns: t,
            end_ns: t + 800,
            result: size as i64,
            ..Event::new(op)
        });
        // Let the writer keep up: this measures the reader, not the writer's drops.
        if i % 100_000 == 99_999 {
            writer.flush();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let stats = writer.finish();
    let size = std::fs::metadata(&path)?.len();
    let before = peak_kib();

    let started = Instant::now();
    let mut reader = Reader::open(&path)?;
    let mut p = Profiler::new(Limits::default());
    let mut records = 0u64;
    while let Some(item) = reader.next_item()? {
        match item {
            Item::Record(r) => {
                records += 1;
                p.push(&r);
            }
            Item::Gap(g) => p.gap(&g),
            Item::End { .. } => {}
        }
    }
    let model = p.finish(Source {
        trace: path.display().to_string(),
        traced_by: "example".into(),
        mode: "library".into(),
        start_unix_ns: 0,
        records: 0,
        dropped: 0,
    });
    let secs = started.elapsed().as_secs_f64();
    let after = peak_kib();
    std::fs::remove_dir_all(&dir)?;
    println!(
        "{records} records ({} dropped writing, {:.0} MiB trace) profiled on one thread in {secs:.2} s: \
         {:.2} M records/s; {} files, {} phases, {} metadata phases, model {} KiB of JSON; \
         peak memory {} MiB before profiling, {} MiB after",
        stats.dropped,
        size as f64 / (1 << 20) as f64,
        records as f64 / secs / 1e6,
        model.files.len(),
        model.phases.len(),
        model.meta_phases.len(),
        model.to_json().len() >> 10,
        before >> 10,
        after >> 10,
    );
    Ok(())
}
