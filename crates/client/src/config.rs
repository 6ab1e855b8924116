//! Where a client finds its cluster on this machine: the cluster file `tessera up` writes and
//! the configuration files that name a cluster. The command line and Python read them here, so
//! both treat a cluster secret that other users could read alike.

use serde::de::DeserializeOwned;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("bad configuration in {path}: {msg}")]
    Parse { path: String, msg: String },
}

/// `$TESSERA_HOME`, or `~/.tessera`.
#[must_use]
pub fn home() -> PathBuf {
    match std::env::var_os("TESSERA_HOME") {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".tessera"),
    }
}

/// Where `tessera up` leaves the address and secret of the cluster it runs.
#[must_use]
pub fn cluster_file() -> PathBuf {
    home().join("cluster.toml")
}

/// Reads the TOML file at `path`. A cluster secret in it that group or others may read is
/// reported: logged as a warning, which is also returned. The cluster file (`own`: Tessera
/// writes it) is made 0600 then; any other file is left for its owner to fix.
pub fn read<T: DeserializeOwned>(
    path: &Path,
    own: bool,
) -> Result<(T, Option<String>), ConfigError> {
    let read_error = |source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    };
    let parse_error = |e: toml::de::Error| ConfigError::Parse {
        path: path.display().to_string(),
        msg: e.to_string(),
    };
    let mut file = std::fs::File::open(path).map_err(read_error)?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(read_error)?;
    let config = toml::from_str(&text).map_err(parse_error)?;
    let holds_secret = toml::from_str::<toml::Table>(&text)
        .map_err(parse_error)?
        .contains_key("secret");
    // The descriptor's mode, and the descriptor is what is changed: no other file in between.
    let mode = file.metadata().map_err(read_error)?.permissions().mode() & 0o7777;
    let warning = (holds_secret && mode & 0o044 != 0).then(|| exposed(&file, path, mode, own));
    Ok((config, warning))
}

fn exposed(file: &std::fs::File, path: &Path, mode: u32, own: bool) -> String {
    let p = path.display();
    let what =
        format!("{p} holds the cluster secret and other users can read it (mode {mode:04o})");
    let msg = if !own {
        format!("{what}: chmod 600 {p}")
    } else {
        match file.set_permissions(std::fs::Permissions::from_mode(0o600)) {
            Ok(()) => format!("{what}: made it 0600"),
            Err(e) => format!("{what}, and making it 0600 failed ({e}): chmod 600 {p}"),
        }
    };
    tracing::warn!("{msg}");
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[derive(serde::Deserialize)]
    struct Secret {
        secret: Option<String>,
    }

    fn file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn secrets_others_can_read_are_reported_and_own_files_fixed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let theirs = file(dir, "c.toml", "secret = \"s\"\n", 0o644);
        let (c, warning) = read::<Secret>(&theirs, false).unwrap();
        assert_eq!(c.secret.as_deref(), Some("s"));
        let warning = warning.unwrap();
        assert!(
            warning.contains(&format!("chmod 600 {}", theirs.display())),
            "{warning}"
        );
        assert_eq!(
            mode(&theirs),
            0o644,
            "a file the user names is theirs to change"
        );

        let own = file(dir, "cluster.toml", "secret = \"s\"\n", 0o640);
        let (_, warning) = read::<Secret>(&own, true).unwrap();
        assert!(warning.unwrap().contains("made it 0600"));
        assert_eq!(mode(&own), 0o600);
        assert!(read::<Secret>(&own, true).unwrap().1.is_none());

        let no_secret = file(dir, "m.toml", "secret_is = 1\n", 0o644);
        assert!(read::<toml::Table>(&no_secret, false).unwrap().1.is_none());
    }
}
