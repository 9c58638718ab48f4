//! A descriptor value with `*` in it, matched as envoyproxy/ratelimit matches one
//! (`wildcardMatch` in `src/config/config_impl.go`): each `*` stands for any run of
//! characters, the empty one too, anywhere in the value.

/// A value pattern, split on its `*`s once, when the configuration is read.
#[derive(Debug)]
pub(super) struct Wildcard {
    /// The literal pieces between the `*`s: at least two, the first and last possibly
    /// empty (`a*` is `["a", ""]`).
    parts: Vec<String>,
}

impl Wildcard {
    /// The pattern of `value`, if it holds a `*`.
    pub(super) fn new(value: &str) -> Option<Wildcard> {
        value.contains('*').then(|| Wildcard {
            parts: value.split('*').map(str::to_owned).collect(),
        })
    }

    /// Whether `value` matches: it starts with the first piece, ends with the last, and
    /// holds the middle ones in order, apart, in between. Taking each middle piece at its
    /// first place is never wrong: a later place leaves less room for the rest.
    pub(super) fn matches(&self, value: &str) -> bool {
        let (first, rest) = self.parts.split_first().expect("at least two parts");
        let (last, middle) = rest.split_last().expect("at least two parts");
        // A value too short for the middle pieces fails their search below.
        if value.len() < first.len() + last.len()
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        let mut between = &value[first.len()..value.len() - last.len()];
        for part in middle {
            match between.find(part.as_str()) {
                Some(at) => between = &between[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::Wildcard;
    use proptest::prelude::*;

    /// The model: a pattern matches if some split of the value gives each `*` a run and
    /// each literal character itself, tried every way there is.
    pub(in crate::config) fn brute_force(pattern: &[u8], value: &[u8]) -> bool {
        match pattern.split_first() {
            None => value.is_empty(),
            Some((b'*', rest)) => (0..=value.len()).any(|skip| brute_force(rest, &value[skip..])),
            Some((c, rest)) => value.first() == Some(c) && brute_force(rest, &value[1..]),
        }
    }

    #[test]
    fn envoys_cases() {
        // envoyproxy/ratelimit@f2fb157 test/config/config_test.go:576 (TestWildcardConfig).
        let cases = [
            ("foo*", "foo1", true),
            ("foo*", "bar", false),
            ("bar*b", "barab", true),
            ("bar*b", "bar123b", true),
            ("bar*b", "barb", true),
            ("bar*b", "bara", false),
            ("bar*b", "xbarb", false),
            ("foo*bar*baz", "foo123bar456baz", true),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo123baz", false),
            ("foo*bar*baz", "bar456baz", false),
            // The prefix and suffix may not overlap.
            ("ab*ba", "aba", false),
            ("/api/*/action", "/api/v1/users/action", true),
            ("*", "", true),
        ];
        for (pattern, value, want) in cases {
            let wildcard = Wildcard::new(pattern).unwrap();
            assert_eq!(wildcard.matches(value), want, "{pattern} ~ {value}");
        }
        assert!(Wildcard::new("plain").is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// On a small alphabet, so that pieces recur and overlap.
        #[test]
        fn matches_as_the_brute_force_model(
            pattern in "[ab*]{1,8}".prop_filter("a wildcard", |p| p.contains('*')),
            value in "[ab]{0,10}",
        ) {
            let wildcard = Wildcard::new(&pattern).unwrap();
            prop_assert_eq!(
                wildcard.matches(&value),
                brute_force(pattern.as_bytes(), value.as_bytes()),
                "{} ~ {}", pattern, value
            );
        }
    }
}
