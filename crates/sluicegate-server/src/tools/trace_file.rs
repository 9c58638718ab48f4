//! A trace on disk, read request by request: docs/SPEC.md's replay CSV or access logs.

use std::fs::File;
use std::io::{self, BufRead, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use sluicegate::Charge;

use super::clf::{self, KeyField};
use super::replay::{self, ReplayLine};

/// The formats a trace file can be in.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TraceFormat {
    /// docs/SPEC.md's replay CSV: time_us,key,cost[,request_id[,mode]].
    Csv,
    /// Common or Combined Log Format access logs.
    Clf,
}

/// An opened trace file.
pub(crate) struct TraceFile {
    path: PathBuf,
    format: TraceFormat,
    /// With [`TraceFormat::Clf`]: which field is the key.
    key_field: KeyField,
    file: File,
}

/// The lines of a trace that could not be read, and were skipped.
#[derive(Default)]
pub(crate) struct Skipped {
    pub(crate) count: u64,
    /// The first one's line number and what is wrong with it.
    pub(crate) first: Option<String>,
}

/// Lines between two updates of the progress line.
const PROGRESS_EVERY: usize = 1 << 20;

/// How much of each end of the file [`TraceFile::span`] reads.
const END_BYTES: u64 = 1 << 16;

impl TraceFile {
    /// Opens the trace at `path`.
    pub(crate) fn open(path: &Path, format: TraceFormat, key_field: KeyField) -> Result<Self> {
        let file = File::open(path).with_context(|| path.display().to_string())?;
        Ok(TraceFile {
            path: path.to_owned(),
            format,
            key_field,
            file,
        })
    }

    /// The time of `line`, if it is a request.
    fn time_of(&self, line: &str) -> Option<u64> {
        match self.format {
            TraceFormat::Csv => replay::parse_line(line).ok().map(|l| l.time),
            TraceFormat::Clf => clf::parse_line(line, self.key_field).ok().map(|(t, _)| t),
        }
    }

    /// The time between the trace's first and last requests, in µs, reading only the
    /// file's two ends.
    pub(crate) fn span(&self) -> Option<u64> {
        let mut head = String::new();
        File::open(&self.path)
            .ok()?
            .take(END_BYTES)
            .read_to_string(&mut head)
            .ok()?;
        let first = head.lines().find_map(|line| self.time_of(line))?;
        let mut file = File::open(&self.path).ok()?;
        let len = file.metadata().ok()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(END_BYTES)))
            .ok()?;
        let mut tail = Vec::new();
        file.read_to_end(&mut tail).ok()?;
        let tail = String::from_utf8_lossy(&tail);
        let last = tail.lines().rev().find_map(|line| self.time_of(line))?;
        last.checked_sub(first).filter(|span| *span > 0)
    }

    /// Calls `request` with every request of the trace, in file order (an access log's
    /// lines are checks of one unit);
    /// blank and `#` lines are ignored, malformed ones skipped and counted. An error of
    /// `request` stops the reading. On a terminal, stderr shows how far it has read.
    pub(crate) fn read(
        self,
        mut request: impl FnMut(&ReplayLine<'_>) -> Result<()>,
    ) -> Result<Skipped> {
        let size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        let progress = io::IsTerminal::is_terminal(&io::stderr());
        let mut skipped = Skipped::default();
        let mut read = 0u64;
        let reader = io::BufReader::with_capacity(1 << 20, &self.file);
        for (index, line) in reader.lines().enumerate() {
            let line = line.with_context(|| self.path.display().to_string())?;
            read += line.len() as u64 + 1;
            if progress && index % PROGRESS_EVERY == 0 && size > 0 {
                eprint!(
                    "\r{} lines, {:.0}%",
                    index,
                    100.0 * read as f64 / size as f64
                );
            }
            let text = line.trim_end_matches('\r');
            if text.trim().is_empty() || text.trim_start().starts_with('#') {
                continue;
            }
            let parsed = match self.format {
                TraceFormat::Csv => replay::parse_line(text).map(|line| request(&line)),
                TraceFormat::Clf => clf::parse_line(text, self.key_field).map(|(time, key)| {
                    request(&ReplayLine {
                        time,
                        key: &key,
                        cost: 1,
                        request_id: None,
                        charge: Charge::Check,
                    })
                }),
            };
            match parsed {
                Ok(decided) => decided?,
                Err(e) => {
                    skipped.count += 1;
                    skipped
                        .first
                        .get_or_insert_with(|| format!("line {}: {e}", index + 1));
                }
            }
        }
        if progress {
            eprintln!();
        }
        Ok(skipped)
    }
}
