//! `--compat`: whose semantics the service keeps where sluicegate's and
//! envoyproxy/ratelimit's differ.

/// The semantics in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Compat {
    /// sluicegate's own (docs/SPEC.md).
    #[default]
    Sluicegate,
    /// envoyproxy/ratelimit's, with its default settings: its environment variables are
    /// read, and its answers are given as it gives them.
    Envoy,
}
