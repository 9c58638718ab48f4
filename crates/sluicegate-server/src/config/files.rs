//! The files a configuration path stands for, what they held when last read, and their
//! text read within a bound of bytes.

use std::fs::File;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Read;
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
/// it counts as a change once, not at every look. Each file is read a piece at a time, and
/// past `max_bytes` only its size counts: a file that large is refused whatever it holds,
/// so a look costs neither its whole size in memory nor the time to read it all.
pub(crate) fn fingerprint(path: &Path, ignore_dotfiles: bool, max_bytes: usize) -> u64 {
    let mut hasher = DefaultHasher::new();
    match files(path, ignore_dotfiles) {
        Ok(files) => {
            for file in files {
                file.hash(&mut hasher);
                if let Err(e) = hash_contents(&file, max_bytes, &mut hasher) {
                    e.kind().hash(&mut hasher);
                }
            }
        }
        Err(e) => e.kind().hash(&mut hasher),
    }
    hasher.finish()
}

/// Hashes the file's size and its first `max_bytes` + 1 bytes.
fn hash_contents(path: &Path, max_bytes: usize, hasher: &mut DefaultHasher) -> std::io::Result<()> {
    let file = File::open(path)?;
    file.metadata()?.len().hash(hasher);
    let mut bounded = file.take(limit_of(max_bytes));
    let mut piece = [0u8; 64 * 1024];
    loop {
        match bounded.read(&mut piece)? {
            0 => return Ok(()),
            n => hasher.write(&piece[..n]),
        }
    }
}

/// Why a file's text was not read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// It holds more than the bytes left: its size, when known.
    TooLarge(Option<u64>),
    /// Not UTF-8, or the file system said no.
    Io(std::io::Error),
}

/// The text of the file at `path`, if it holds at most `room` bytes. The size is looked at
/// first, and no more than `room` + 1 bytes are ever read (a file that grows, or claims no
/// size as `/proc` files do, is bounded too), so a file too large costs no memory.
pub(crate) fn read_at_most(path: &Path, room: usize) -> Result<String, ReadError> {
    let file = File::open(path).map_err(ReadError::Io)?;
    let size = file.metadata().map_err(ReadError::Io)?.len();
    if size >= limit_of(room) {
        return Err(ReadError::TooLarge(Some(size)));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit_of(room))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() > room {
        return Err(ReadError::TooLarge(None));
    }
    String::from_utf8(bytes)
        .map_err(|e| ReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// `max_bytes` + 1: what to read to tell a file of `max_bytes` from a larger one.
fn limit_of(max_bytes: usize) -> u64 {
    u64::try_from(max_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}
