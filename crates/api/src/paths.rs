//! Where a node keeps its files.

use std::path::{Path, PathBuf};

/// The environment variable that names the data dir when `--data` is absent.
pub const DATA_ENV: &str = "MESH_DATA";
/// The control socket's file name in the data dir.
pub const SOCKET_FILE: &str = "mesh.sock";
/// The optional config file's name in the data dir.
pub const CONFIG_FILE: &str = "config.toml";
/// The node key's file name in the data dir.
pub const KEY_FILE: &str = "node.key";
/// The file in the data dir that remembers the port the node listened on
/// (decimal text), asked for again when `bind` has port 0.
pub const LISTEN_PORT_FILE: &str = "listen-port";

/// The files of one node inside its data dir.
#[derive(Clone, Debug)]
pub struct DataDir {
    root: PathBuf,
}

/// Errors finding or creating the data dir.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataDirError {
    /// No `--data`, no `MESH_DATA`, and neither `XDG_DATA_HOME` nor `HOME` is set.
    #[error("no data dir: pass --data DIR or set MESH_DATA (HOME and XDG_DATA_HOME are unset)")]
    NoDefault,
    /// The dir could not be created or its mode set.
    #[error("cannot create data dir {path}: {source}")]
    Create {
        /// The dir.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl DataDir {
    /// The data dir: `explicit` if given, else `$MESH_DATA`, else
    /// `$XDG_DATA_HOME/agent-mesh`, else `~/.local/share/agent-mesh`.
    pub fn resolve(explicit: Option<&Path>) -> Result<Self, DataDirError> {
        if let Some(p) = explicit {
            return Ok(DataDir { root: p.to_owned() });
        }
        if let Some(p) = std::env::var_os(DATA_ENV).filter(|v| !v.is_empty()) {
            return Ok(DataDir {
                root: PathBuf::from(p),
            });
        }
        if let Some(p) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
            return Ok(DataDir {
                root: PathBuf::from(p).join("agent-mesh"),
            });
        }
        let home = std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .ok_or(DataDirError::NoDefault)?;
        Ok(DataDir {
            root: PathBuf::from(home).join(".local/share/agent-mesh"),
        })
    }

    /// Creates the dir (and parents) if missing, with mode 0700 on the dir itself.
    pub fn create(&self) -> Result<(), DataDirError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let err = |source| DataDirError::Create {
            path: self.root.clone(),
            source,
        };
        if !self.root.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.root)
                .map_err(err)?;
        }
        // Tighten an existing dir too: the socket and key live here.
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o700))
            .map_err(err)?;
        Ok(())
    }

    /// The dir itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The node's secret key file.
    pub fn key_path(&self) -> PathBuf {
        self.root.join(KEY_FILE)
    }

    /// The control socket.
    pub fn socket_path(&self) -> PathBuf {
        self.root.join(SOCKET_FILE)
    }

    /// The optional config file.
    pub fn config_path(&self) -> PathBuf {
        self.root.join(CONFIG_FILE)
    }

    /// The remembered listen port ([`LISTEN_PORT_FILE`]).
    pub fn listen_port_path(&self) -> PathBuf {
        self.root.join(LISTEN_PORT_FILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_dir_wins_and_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::resolve(Some(&tmp.path().join("a/b"))).unwrap();
        dir.create().unwrap();
        let mode = std::fs::metadata(dir.root()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(dir.key_path(), tmp.path().join("a/b/node.key"));
    }
}
