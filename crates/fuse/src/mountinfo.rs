//! The mount table (`/proc/self/mountinfo`), read instead of stat'ing the mount point: a FUSE
//! server that stats its own mount asks itself, and if it is killed while a worker holds that
//! request, the kernel waits for an answer no thread is left to give and the process never
//! exits (seen as a `tessera mount` stuck in D state after SIGKILL).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A mount's device number, `major:minor` (for a FUSE mount, the minor is its connection in
/// `/sys/fs/fuse/connections`).
pub type Device = (u32, u32);

/// The devices mounted on `dir`, bottom first. `dir` must be canonical (absolute, no `..` nor
/// symbolic links), as the table writes mount points.
pub fn devices_on(dir: &Path) -> Vec<Device> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|table| parse(&table, dir))
        .unwrap_or_default()
}

fn parse(table: &str, dir: &Path) -> Vec<Device> {
    let dir = dir.as_os_str().as_bytes();
    table
        .lines()
        .filter_map(|line| {
            // mount ID, parent ID, major:minor, root, mount point, ...
            let mut fields = line.split(' ');
            let dev = fields.nth(2)?;
            let point = fields.nth(1)?;
            if unescape(point) != dir {
                return None;
            }
            let (major, minor) = dev.split_once(':')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        })
        .collect()
}

/// The table writes a space, tab, newline or backslash in a path as `\` and 3 octal digits.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
44 27 0:40 / /tmp/t/stop rw,nosuid,nodev - fuse tessera rw,user_id=0
45 27 0:41 / /tmp/with\\040space rw - fuse tessera rw
46 44 0:42 / /tmp/t/stop rw - fuse tessera rw
";

    #[test]
    fn finds_every_mount_on_a_directory_bottom_first() {
        assert_eq!(
            parse(TABLE, Path::new("/tmp/t/stop")),
            vec![(0, 40), (0, 42)]
        );
        assert_eq!(parse(TABLE, Path::new("/tmp/with space")), vec![(0, 41)]);
        assert!(parse(TABLE, Path::new("/tmp/t")).is_empty());
        assert!(parse("garbage\n\n1 2", Path::new("/tmp/t")).is_empty());
    }

    #[test]
    fn unescapes_octal_and_keeps_the_rest() {
        assert_eq!(unescape(r"a\040b\134c\011"), b"a b\\c\t");
        assert_eq!(unescape(r"a\04"), br"a\04");
        assert_eq!(unescape(r"\999x"), br"\999x");
    }
}
