//! The files a configuration path stands for, and what they held when last read.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

/// The files a configuration path stands for, in a stable order: the path itself if it
/// is not a directory; else every file below it, at any depth, whatever its name, as
/// envoyproxy/ratelimit's runtime loader (lyft/goruntime) walks its directory — names in
/// byte order, a directory's files where its name sorts, a symbolic link to a file read,
/// one to a directory not followed (Kubernetes mounts a ConfigMap's files through both),
/// and with `ignore_dotfiles` no file or directory whose name starts with a dot.
pub(crate) fn files(path: &Path, ignore_dotfiles: bool) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    if path.is_dir() {
        walk(path, ignore_dotfiles, &mut files)?;
    } else {
        files.push(path.to_owned());
    }
    Ok(files)
}

fn walk(dir: &Path, ignore_dotfiles: bool, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries = std::fs::read_dir(dir)?.collect::<Result<Vec<_>, _>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        if ignore_dotfiles && entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(&path, ignore_dotfiles, out)?;
        } else if !(kind.is_symlink() && path.is_dir()) {
            out.push(path);
        }
    }
    Ok(())
}

/// What a configuration path's files hold now, to notice edits: a hash of the file list
/// and of every file's bytes. Contents rather than sizes and modification times, which an
/// edit can leave as they were (a same-length rewrite within the clock's resolution, a
/// tool that restores times). A path or file that cannot be read hashes as its error, so
/// it counts as a change once, not at every look.
pub(crate) fn fingerprint(path: &Path, ignore_dotfiles: bool) -> u64 {
    let mut hasher = DefaultHasher::new();
    match files(path, ignore_dotfiles) {
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
