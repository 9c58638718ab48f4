//! What a refusal's `retry_after` must cover, shared by every algorithm.

/// What a refused decision's `retry_after` must say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RetryNeed {
    /// This rule would have allowed (another rule refused the check): 0.
    None,
    /// The rule is over its limit for a check of this many units.
    Units(u64),
    /// The cost can never fit.
    Never,
}
