//! The files a configuration path stands for, and what they held when last read.

use std::hash::{DefaultHasher, Hash, Hasher};
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

/// What a configuration path's files hold now, to notice edits: a hash of the file list
/// and of every file's bytes. Contents rather than sizes and modification times, which an
/// edit can leave as they were (a same-length rewrite within the clock's resolution, a
/// tool that restores times). A path or file that cannot be read hashes as its error, so
/// it counts as a change once, not at every look.
pub(crate) fn fingerprint(path: &Path) -> u64 {
    let mut hasher = DefaultHasher::new();
    match files(path) {
        Ok(files) => {
            for file in files {
                file.hash(&mut hasher);
                match std::fs::read(&file) {
                    Ok(bytes) => bytes.hash(&mut hasher),
                    Err(e) => e.kind().hash(&mut hasher),
                }
            }
        }
        Err(e) => e.kind().hash(&mut hasher),
    }
    hasher.finish()
}
