//! The node's secret key on disk: `<data>/node.key`, 32 raw bytes, mode 0600.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use mesh_protocol::SecretKey;
use tracing::{info, warn};

use super::NetError;

/// File name of the node key inside the data directory.
pub const NODE_KEY_FILE: &str = "node.key";

/// Bytes in a node key file: the raw ed25519 secret key.
pub const NODE_KEY_BYTES: usize = 32;

/// Loads `<data_dir>/node.key`, or creates it with a fresh key if it is absent.
///
/// A new key is written to a temporary file (mode 0600), fsynced, then linked
/// into place with `hard_link`, which — unlike `rename` — refuses to replace a
/// key another process created at the same moment; the directory is fsynced
/// after. An existing file of the wrong size is an error and is never replaced:
/// it is this node's identity.
///
/// # Errors
/// [`NetError::KeyIo`] if the file or directory cannot be read or written,
/// [`NetError::KeyWrongSize`] if the file does not hold exactly 32 bytes.
pub fn load_or_create_node_key(data_dir: &Path) -> Result<SecretKey, NetError> {
    load_or_create_key(data_dir, NODE_KEY_FILE)
}

/// Loads `<dir>/<file>`, or creates it with a fresh key, exactly as
/// [`load_or_create_node_key`] does for the node key (the daemon keeps each
/// agent's key this way too).
///
/// # Errors
/// As [`load_or_create_node_key`].
pub fn load_or_create_key(data_dir: &Path, file: &str) -> Result<SecretKey, NetError> {
    let path = data_dir.join(file);
    match read_key(&path) {
        Ok(key) => return Ok(key),
        Err(NetError::KeyIo { source, .. }) if source.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    link_new(data_dir, file, SecretKey::generate())
}

/// Writes `key` to `<dir>/<file>` (mode 0600), as a new key is written,
/// unless the file exists: then it must hold this very key. The daemon
/// keeps an imported agent's key this way.
///
/// # Errors
/// As [`load_or_create_node_key`]; [`NetError::KeyIo`] with
/// `AlreadyExists` if the file holds another key.
pub fn store_key(dir: &Path, file: &str, key: &SecretKey) -> Result<(), NetError> {
    let held = link_new(dir, file, key.clone())?;
    if held.to_bytes() != key.to_bytes() {
        return Err(NetError::KeyIo {
            path: dir.join(file),
            source: std::io::Error::new(ErrorKind::AlreadyExists, "another key is there"),
        });
    }
    Ok(())
}

/// Links `key` into `<data_dir>/<file>` through a temporary file; returns
/// the key that is there after (another one, if a process put it there
/// first).
fn link_new(data_dir: &Path, file: &str, key: SecretKey) -> Result<SecretKey, NetError> {
    let path = data_dir.join(file);
    let tmp = data_dir.join(format!(
        "{file}.tmp.{}.{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| NetError::KeyIo { path, source }
    };
    let written = write_new(&tmp, &key.to_bytes()).map_err(io(&tmp));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let linked = fs::hard_link(&tmp, &path);
    // The temporary name is only a staging area; the key lives at `path` now (or
    // someone else's does).
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            File::open(data_dir)
                .and_then(|d| d.sync_all())
                .map_err(io(data_dir))?;
            info!(path = %path.display(), key = %key.public().fmt_short(), "created a key");
            Ok(key)
        }
        // Another process created it between our read and our link: use theirs.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => read_key(&path),
        Err(e) => Err(io(&path)(e)),
    }
}

fn read_key(path: &Path) -> Result<SecretKey, NetError> {
    let io = |source| NetError::KeyIo {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    warn_if_readable_by_others(path, &file);
    // Read one byte more than a key so a longer file is told apart without
    // reading all of it.
    let mut buf = [0u8; NODE_KEY_BYTES + 1];
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    if len != NODE_KEY_BYTES {
        let len = file.metadata().map(|m| m.len()).unwrap_or(len as u64);
        return Err(NetError::KeyWrongSize {
            path: path.to_path_buf(),
            len,
        });
    }
    let mut bytes = [0u8; NODE_KEY_BYTES];
    bytes.copy_from_slice(&buf[..NODE_KEY_BYTES]);
    Ok(SecretKey::from_bytes(&bytes))
}

fn write_new(path: &PathBuf, bytes: &[u8]) -> std::io::Result<()> {
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut file = opts.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path, file: &File) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = file.metadata() {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            warn!(path = %path.display(), mode = format!("{mode:o}"), "a key file is readable by other users; chmod 600 it");
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path, _file: &File) {}
