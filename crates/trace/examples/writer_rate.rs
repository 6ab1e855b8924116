//! How fast the trace writer takes records: producer threads push records of a 1 MiB read
//! (a path, a program name) flat out for two seconds into a trace with the default options,
//! then the rate, the records dropped (gaps) and the bytes per record are printed.
//! Run: cargo run --release -p tessera-trace --example writer_rate [THREADS] [SECONDS]

use std::time::{Duration, Instant};
use tessera_trace::{Event, Mode, Op, Options, Writer};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let threads: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let dir = std::env::temp_dir().join(format!("writer-rate-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (path, writer) =
        Writer::create_in(&dir, "example".into(), Mode::PageCache, &Options::default())?;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(secs);
    let pushed: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let w = &writer;
                s.spawn(move || {
                    let path = format!("/data/run-{t}/part-0001.bin");
                    let mut n = 0u64;
                    while Instant::now() < until {
                        for _ in 0..256 {
                            let start = w.now();
                            w.push(&Event {
                                pid: 4242 + t,
                                uid: 1000,
                                exe: Some(b"python3"),
                                ino: 77 + u64::from(t),
                                path: Some(path.as_bytes()),
                                offset: n << 20,
                                size: 1 << 20,
                                server_size: Some(1 << 20),
                                start_ns: start,
                                end_ns: start + 1000,
                                result: 1 << 20,
                                ..Event::new(Op::Read)
                            });
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let stats = writer.finish();
    let size = std::fs::metadata(&path)?.len();
    std::fs::remove_dir_all(&dir)?;
    println!(
        "trace writer, {threads} producer threads flat out for {elapsed:.2} s: {:.2} M records/s \
         pushed, {} kept, {} dropped ({:.4} %), {:.1} bytes per record",
        pushed as f64 / elapsed / 1e6,
        stats.records,
        stats.dropped,
        100.0 * stats.dropped as f64 / pushed.max(1) as f64,
        size as f64 / stats.records.max(1) as f64
    );
    Ok(())
}
