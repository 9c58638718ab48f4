//! The files a configuration path stands for, and how they looked when last read.

use std::path::{Path, PathBuf};

/// The files a configuration path stands for, in a stable order.
pub(crate) fn files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| {
            p.is_file()
                && p.extension().is_some_and(|e| {
                    e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml")
                })
        })
        .collect();
    files.sort();
    Ok(files)
}

/// One configuration file as it was seen: path, modification time, length.
pub(crate) type FileStamp = (PathBuf, Option<std::time::SystemTime>, u64);

/// What a configuration path's files look like now, to notice edits.
pub(crate) fn fingerprint(path: &Path) -> Vec<FileStamp> {
    files(path)
        .unwrap_or_default()
        .into_iter()
        .map(|file| {
            let meta = std::fs::metadata(&file).ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let len = meta.map_or(0, |m| m.len());
            (file, modified, len)
        })
        .collect()
}
