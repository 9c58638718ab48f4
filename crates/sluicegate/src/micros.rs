//! The one conversion of a [`Duration`] that crosses the public API into the integer µs
//! every time is kept in inside the library (docs/SPEC.md counts in µs).

use std::time::Duration;

/// `duration` in whole µs, the unit of every time inside the library.
///
/// A part below one microsecond is dropped (rounded down: 1.9 µs is 1 µs, 900 ns is 0).
/// `None` past `u64::MAX` µs (about 584,000 years): each caller turns that into its own
/// answer, never a wrapped value — a rule's window is then a [`RuleError`] like any
/// window past [`MAX_SPAN`], and a [`ManualClock`] stands at its latest time.
///
/// [`RuleError`]: crate::RuleError
/// [`MAX_SPAN`]: crate::rule::MAX_SPAN
/// [`ManualClock`]: crate::ManualClock
pub(crate) fn whole_micros(duration: Duration) -> Option<u64> {
    u64::try_from(duration.as_micros()).ok()
}

/// `duration` in whole µs as [`whole_micros`] counts, held at `u64::MAX` µs past it:
/// for times the library keeps without a way to refuse them (a clock's reading, a
/// decision's wait), where about 584,000 years means "never" anyway.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub fn saturating_micros(duration: Duration) -> u64 {
    whole_micros(duration).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_sub_microsecond_parts_and_refuses_what_does_not_fit() {
        assert_eq!(whole_micros(Duration::from_nanos(1_999)), Some(1));
        assert_eq!(whole_micros(Duration::from_nanos(999)), Some(0));
        assert_eq!(whole_micros(Duration::from_secs(60)), Some(60_000_000));
        assert_eq!(
            whole_micros(Duration::from_micros(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(whole_micros(Duration::MAX), None);
        assert_eq!(saturating_micros(Duration::MAX), u64::MAX);
    }
}
