//! Human-readable figures: sizes, bars, permission strings, dates.

use tessera_client::{FileKind, Inode, Timespec};

/// Bytes as a short figure in binary units: `512 B`, `1.5 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `part / whole`, 0 when the whole is empty.
pub fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// A text bar, `[####....]`, `width` characters inside the brackets.
pub fn bar(frac: f64, width: usize) -> String {
    let full = ((frac.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("[{}{}]", "#".repeat(full), ".".repeat(width - full))
}

/// `drwxr-xr-x`, as `ls -l` shows it (with setuid, setgid and sticky bits).
pub fn mode_string(i: &Inode) -> String {
    let kind = match i.kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
    };
    let m = i.mode;
    let mut s = String::with_capacity(10);
    s.push(kind);
    for (shift, special, set, unset) in [(6, 0o4000, 's', 'S'), (3, 0o2000, 's', 'S')] {
        let bits = (m >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, m & special != 0) {
            (true, true) => set,
            (false, true) => unset,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s.push(if m & 4 != 0 { 'r' } else { '-' });
    s.push(if m & 2 != 0 { 'w' } else { '-' });
    s.push(match (m & 1 != 0, m & 0o1000 != 0) {
        (true, true) => 't',
        (false, true) => 'T',
        (true, false) => 'x',
        (false, false) => '-',
    });
    s
}

/// `2026-11-18 11:06:40` (UTC).
pub fn time(t: Timespec) -> String {
    let secs = t.secs;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode(kind: FileKind, mode: u32) -> Inode {
        Inode {
            ino: 2,
            kind,
            mode,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 1,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            parent: 0,
            target: Vec::new(),
            open_count: 0,
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(256 << 20), "256.0 MiB");
    }

    #[test]
    fn bars() {
        assert_eq!(bar(0.0, 4), "[....]");
        assert_eq!(bar(0.5, 4), "[##..]");
        assert_eq!(bar(7.0, 4), "[####]");
        assert_eq!(fraction(1, 0), 0.0);
    }

    #[test]
    fn modes() {
        assert_eq!(mode_string(&inode(FileKind::Dir, 0o755)), "drwxr-xr-x");
        assert_eq!(mode_string(&inode(FileKind::File, 0o644)), "-rw-r--r--");
        assert_eq!(mode_string(&inode(FileKind::File, 0o4755)), "-rwsr-xr-x");
        assert_eq!(mode_string(&inode(FileKind::Dir, 0o1777)), "drwxrwxrwt");
        assert_eq!(mode_string(&inode(FileKind::Symlink, 0o777)), "lrwxrwxrwx");
    }

    #[test]
    fn dates() {
        assert_eq!(time(Timespec { secs: 0, nanos: 0 }), "1970-01-01 00:00:00");
        assert_eq!(
            time(Timespec {
                secs: 1_795_000_000,
                nanos: 0
            }),
            "2026-11-18 11:06:40"
        );
    }
}
