//! The coordinator cluster's limits configuration as the agent last took it, kept in the data
//! directory (`cluster-limits.json`) so that a restart enforces the cluster's version until the
//! cluster answers again, instead of going back to the agent's own files.
//!
//! A file of its own beside the store rather than a store record: it is written once per
//! configuration change (rare, whole, at most `MAX_CONFIG_BYTES` of text), and the store's
//! records are the budget machine's. Written to a temporary file, flushed, renamed over the
//! old one and the directory flushed, so a crash leaves the old version or the new one.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use allot_core::sync::{ConfigFiles, MAX_CONFIG_BYTES};

/// The file's name in the data directory.
pub const FILE_NAME: &str = "cluster-limits.json";

/// Largest file read back: the configuration's text JSON-escaped, with room for the envelope.
const MAX_FILE_BYTES: u64 = 4 * MAX_CONFIG_BYTES as u64;

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// Replaces the kept configuration with `files`, durably.
pub fn persist(data_dir: &Path, files: &ConfigFiles) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(files).map_err(std::io::Error::other)?;
    let tmp = data_dir.join(format!("{FILE_NAME}.tmp"));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path(data_dir))?;
    File::open(data_dir)?.sync_all()
}

/// The kept configuration, if there is one; an error names the file and what is wrong.
pub fn read(data_dir: &Path) -> Result<Option<ConfigFiles>, String> {
    let path = path(data_dir);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{}: larger than {MAX_FILE_BYTES} bytes",
            path.display()
        ));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("{}: not a kept configuration: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use allot_core::sync::ConfigFile;

    use super::*;

    #[test]
    fn a_kept_configuration_reads_back_and_a_damaged_one_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read(dir.path()), Ok(None));
        let files = ConfigFiles {
            version: 7,
            merge_domains: true,
            files: vec![ConfigFile {
                name: "a.yaml".into(),
                text: "domain: d\n".into(),
            }],
        };
        persist(dir.path(), &files).expect("persist");
        assert_eq!(read(dir.path()), Ok(Some(files)));
        fs::write(path(dir.path()), b"{\"version\": 1").expect("damage");
        let err = read(dir.path()).expect_err("damaged");
        assert!(
            err.contains("cluster-limits.json: not a kept configuration"),
            "{err}"
        );
    }
}
