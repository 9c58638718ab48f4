//! How long the client waits before connecting again, as envoyproxy/ratelimit waits.
//!
//! After a stream that broke: envoy's `jpillora/backoff` with the
//! `XDS_CLIENT_BACKOFF_*` settings (`src/provider/xds_grpc_sotw_provider.go`). The n-th
//! wait (from 0) is `initial · factor^n`, with jitter a uniform draw between `initial`
//! and that, kept within `[initial, max]`; the count of waits is never reset. (So the
//! defaults, factor 0.5, wait `initial` every time: a factor below 1 only shrinks the
//! product, which the bounds lift back to `initial`.)
//!
//! Between attempts to reach a server that does not answer: the retry interval, spread
//! by ±50% (envoy's `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` and the 0.5 jitter
//! it is given with).

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The back-off's settings (`--config-xds-backoff-*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffOptions {
    /// The first wait, and the shortest.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// What each wait multiplies the first by, once more than the one before (envoy calls
    /// it the random factor).
    pub factor: f64,
    /// Draw each wait between `initial` and the product.
    pub jitter: bool,
}

impl Default for BackoffOptions {
    /// envoyproxy/ratelimit's defaults.
    fn default() -> Self {
        BackoffOptions {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor: 0.5,
            jitter: true,
        }
    }
}

/// A uniform draw in [0, 1).
pub(super) type Random = Box<dyn FnMut() -> f64 + Send>;

/// A draw from the process's random hasher keys: no generator to seed or share.
pub(super) fn random() -> Random {
    Box::new(|| {
        let bits = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        // The top 53 bits, as a fraction.
        (bits >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// The waits after broken streams, one after another.
pub(super) struct Backoff {
    options: BackoffOptions,
    attempt: i32,
    random: Random,
}

impl Backoff {
    pub(super) fn new(options: BackoffOptions, random: Random) -> Self {
        Backoff {
            options,
            attempt: 0,
            random,
        }
    }

    /// The next wait.
    pub(super) fn next_wait(&mut self) -> Duration {
        let BackoffOptions {
            initial,
            max,
            factor,
            jitter,
        } = self.options;
        let attempt = self.attempt;
        self.attempt = self.attempt.saturating_add(1);
        if initial >= max {
            return max;
        }
        let least = initial.as_secs_f64();
        let mut wait = least * factor.powi(attempt);
        if jitter {
            wait = (self.random)() * (wait - least) + least;
        }
        if !wait.is_finite() || wait >= max.as_secs_f64() {
            return max;
        }
        Duration::from_secs_f64(wait).max(initial)
    }
}

/// The wait between attempts to connect: `interval` spread by ±50%.
pub(super) fn retry_wait(interval: Duration, random: &mut Random) -> Duration {
    interval.mul_f64(0.5 + random())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(draw: f64) -> Random {
        Box::new(move || draw)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn envoy_defaults_wait_the_initial_interval_every_time() {
        for draw in [0.0, 0.5, 0.999] {
            let mut backoff = Backoff::new(BackoffOptions::default(), fixed(draw));
            let waits: Vec<Duration> = (0..6).map(|_| backoff.next_wait()).collect();
            assert_eq!(waits, vec![secs(10); 6], "draw {draw}");
        }
    }

    #[test]
    fn a_factor_above_one_grows_to_the_max_and_is_never_reset() {
        let options = BackoffOptions {
            initial: secs(1),
            max: secs(10),
            factor: 2.0,
            jitter: false,
        };
        let mut backoff = Backoff::new(options, fixed(0.0));
        let waits: Vec<u64> = (0..7).map(|_| backoff.next_wait().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10, 10]);
    }

    #[test]
    fn jitter_draws_between_the_initial_interval_and_the_product() {
        let options = BackoffOptions {
            initial: secs(1),
            max: secs(60),
            factor: 2.0,
            jitter: true,
        };
        // Attempt 3: the product is 8 s; a draw of 0.5 lands half way from 1 s, at 4.5 s.
        let mut backoff = Backoff::new(options, fixed(0.5));
        let waits: Vec<Duration> = (0..4).map(|_| backoff.next_wait()).collect();
        assert_eq!(
            waits,
            [
                secs(1),
                Duration::from_millis(1500),
                Duration::from_millis(2500),
                Duration::from_millis(4500)
            ]
        );
    }

    #[test]
    fn an_initial_interval_at_or_over_the_max_waits_the_max() {
        let options = BackoffOptions {
            initial: secs(30),
            max: secs(20),
            ..BackoffOptions::default()
        };
        let mut backoff = Backoff::new(options, fixed(0.3));
        assert_eq!(backoff.next_wait(), secs(20));
        assert_eq!(backoff.next_wait(), secs(20));
    }

    #[test]
    fn the_retry_interval_is_spread_by_half() {
        let interval = secs(4);
        assert_eq!(retry_wait(interval, &mut fixed(0.0)), secs(2));
        assert_eq!(retry_wait(interval, &mut fixed(0.5)), secs(4));
        assert_eq!(retry_wait(interval, &mut fixed(0.75)), secs(5));
    }

    #[test]
    fn draws_are_fractions() {
        let mut draw = random();
        for _ in 0..1000 {
            let d = draw();
            assert!((0.0..1.0).contains(&d), "{d}");
        }
    }
}
