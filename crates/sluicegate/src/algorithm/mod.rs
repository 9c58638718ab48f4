//! The Rust reference of docs/SPEC.md: every algorithm as pure state transitions, no I/O and no
//! clock reads. Stores only make them atomic (the in-memory store runs them under a lock;
//! the Redis scripts re-implement them and are held to them by differential tests).
//!
//! One check of one rule goes in two steps, so that a check of several rules can be
//! all-or-nothing: [`RuleState::evaluate`] finds whether the cost fits, then either
//! [`RuleState::admit`] records it or [`RuleState::refuse`] answers without a change.

mod charge;
mod fixed_window;
mod gcra;
mod request_ids;
mod retry;
mod sliding_counter;
mod sliding_log;
mod usage;

pub use charge::Charge;
use fixed_window::{FixedPlan, FixedWindowState};
use gcra::{GcraPlan, GcraState};
pub use request_ids::RequestUse;
use request_ids::{Namespace, Remembered, RequestIds, Reservation};
use retry::RetryNeed;
use sliding_counter::{CounterPlan, SlidingCounterState};
use sliding_log::{LogPlan, SlidingLogState};
pub(crate) use usage::creates_entry;

/// About what remembering one more request id of `id_len` bytes adds to a state's heap.
pub(crate) fn request_id_bytes(id_len: usize) -> usize {
    request_ids::RequestIds::one_more(id_len)
}

use std::mem::ManuallyDrop;

use crate::decision::Decision;
use crate::rule::{Algorithm, Rule};

/// The state of one (rule, key).
#[derive(Clone, Debug)]
pub(crate) struct RuleState {
    /// The latest time at which this state was written: time never runs backwards per key.
    latest: u64,
    kind: StateKind,
    /// Request ids still remembered: admissions (so a retry is not counted twice),
    /// reservations, and the ids of reports, settles and refunds.
    request_ids: RequestIds,
}

/// The logs and counters live behind a box so that every state is 24 bytes, the size of
/// the buckets' and the fixed window's two words, and a store's entry fits one cache line.
#[derive(Clone, Debug)]
enum StateKind {
    Log(Box<SlidingLogState>),
    Fixed(FixedWindowState),
    Counter(Box<SlidingCounterState>),
    Gcra(GcraState),
}

/// A fixed window's or a bucket's state as plain words: all that a check without a request
/// id is decided from, so that a store can publish it to readers that take no lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StateWords {
    pub(crate) latest: u64,
    pub(crate) words: [u64; 2],
}

impl StateWords {
    /// Whether the states of `rule` are words: a fixed window's or a bucket's.
    pub(crate) fn hold(rule: &Rule) -> bool {
        !matches!(
            rule.algorithm(),
            Algorithm::SlidingLog | Algorithm::SlidingCounter
        )
    }
}

#[derive(Clone, Copy, Debug)]
enum Plan {
    Log(LogPlan),
    Fixed(FixedPlan),
    Counter(CounterPlan),
    Gcra(GcraPlan),
}

/// Whether a check fits one rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The cost fits.
    Fits,
    /// The cost does not fit now.
    OverLimit,
    /// The cost can never fit.
    Never,
    /// The request id was admitted before and still counts: allowed, nothing recorded.
    Repeat {
        /// When the first admission could go on.
        release_at: u64,
    },
}

/// The units a check of `cost` in mode `charge` is decided for under `rule` (docs/SPEC.md,
/// "A check and its cost"): its cost, and for a peek (cost 0) one unit — but none when
/// refusals are charged, as envoyproxy/ratelimit adds the hits and then compares (so a
/// peek fits while the usage is at most the capacity, and is refused only past it), in
/// every algorithm but the sliding log, which keeps only its newest L live units and so
/// cannot tell a full log from one past its limit.
#[inline(always)]
pub(crate) fn units_of(rule: &Rule, cost: u64, charge: Charge) -> u64 {
    let counted_after =
        charge == Charge::CheckChargingRefusals && rule.algorithm() != Algorithm::SlidingLog;
    if cost == 0 && !counted_after { 1 } else { cost }
}

/// The outcome of [`RuleState::evaluate`]: to be passed back to `admit` or `refuse` of the
/// same state, unchanged in between.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Evaluation {
    now: u64,
    cost: u64,
    /// The units the decision answers for ([`units_of`]).
    units: u64,
    verdict: Verdict,
    plan: Plan,
}

impl Evaluation {
    /// Fits, or is an admitted request's retry.
    pub(crate) fn allows(&self) -> bool {
        matches!(self.verdict, Verdict::Fits | Verdict::Repeat { .. })
    }

    fn retry_need(&self) -> RetryNeed {
        match self.verdict {
            Verdict::Fits | Verdict::Repeat { .. } => RetryNeed::None,
            Verdict::OverLimit => RetryNeed::Units(self.units),
            Verdict::Never => RetryNeed::Never,
        }
    }

    /// Whether admitting records units (a peek does not).
    pub(crate) fn records_admission(&self) -> bool {
        self.cost > 0
    }

    /// Whether this evaluation records units: on an admission of the check (`admitted`),
    /// unless it is a peek; on a refusal, when `charge` counts this rule's refused units.
    pub(crate) fn records(&self, admitted: bool, charge: Charge) -> bool {
        if admitted {
            self.records_admission()
        } else {
            self.charged(charge)
        }
    }

    /// Whether this rule's own refusal records its units under `charge`.
    pub(crate) fn charged(&self, charge: Charge) -> bool {
        charge == Charge::CheckChargingRefusals
            && self.cost > 0
            && matches!(self.verdict, Verdict::OverLimit | Verdict::Never)
            && matches!(self.plan, Plan::Fixed(_))
    }
}

impl Plan {
    #[inline(always)] // on the memory store's checks, as `RuleState::plan`
    fn fits(self, rule: &Rule, now: u64, units: u64) -> bool {
        match self {
            Plan::Log(p) => SlidingLogState::fits(p, rule, units),
            Plan::Fixed(p) => FixedWindowState::fits(p, rule, units),
            Plan::Counter(p) => SlidingCounterState::fits(p, rule, units),
            Plan::Gcra(p) => GcraState::fits(p, rule, now, units),
        }
    }
}

impl RuleState {
    pub(crate) fn new(rule: &Rule) -> Self {
        let kind = match rule.algorithm() {
            Algorithm::SlidingLog => StateKind::Log(Box::default()),
            Algorithm::FixedWindow => StateKind::Fixed(FixedWindowState::default()),
            Algorithm::SlidingCounter => StateKind::Counter(Box::default()),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                StateKind::Gcra(GcraState::default())
            }
        };
        RuleState {
            latest: 0,
            kind,
            request_ids: RequestIds::default(),
        }
    }

    /// This state as words, for a fixed window or a bucket; `None` for a log or a counter,
    /// whose state does not fit in a few words. The request ids are left out: only a check
    /// with an id reads them.
    pub(crate) fn words(&self) -> Option<StateWords> {
        let words = match &self.kind {
            StateKind::Fixed(state) => state.words(),
            StateKind::Gcra(state) => state.words(),
            StateKind::Log(_) | StateKind::Counter(_) => return None,
        };
        Some(StateWords {
            latest: self.latest,
            words,
        })
    }

    /// The state [`RuleState::words`] gave of a state of `rule`, remembering no request id
    /// (so to be asked only by a check without one); `None` for a log or a counter.
    // Inlined (as are `evaluate` and `refuse`) into the memory store's refusal without a
    // lock: returned through the stack, their results are read back wider than they are
    // written, and each such read waits for the stores to land (perf: most of that path).
    //
    // Never dropped: it holds no request id, so its drop frees nothing, and the drop's
    // out-of-line calls would be a tenth of that path.
    #[inline(always)]
    pub(crate) fn from_words(
        rule: &Rule,
        StateWords { latest, words }: StateWords,
    ) -> Option<ManuallyDrop<Self>> {
        let kind = match rule.algorithm() {
            Algorithm::FixedWindow => StateKind::Fixed(FixedWindowState::from_words(words)),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                StateKind::Gcra(GcraState::from_words(words))
            }
            Algorithm::SlidingLog | Algorithm::SlidingCounter => return None,
        };
        Some(ManuallyDrop::new(RuleState {
            latest,
            kind,
            request_ids: RequestIds::default(),
        }))
    }

    /// The refusal of a check of this rule alone when it is refused and its refusal records
    /// nothing: decided by reading only, so under a shared lock or from published words.
    /// `None` when the check fits, is charged, or never refuses (it must then be decided by
    /// [`RuleState::decide_alone`]).
    #[inline(always)]
    pub(crate) fn refusal(
        &self,
        rule: &Rule,
        t: u64,
        cost: u64,
        request_id: Option<&str>,
        charge: Charge,
    ) -> Option<Decision> {
        if !charge.may_refuse() {
            return None;
        }
        let eval = self.evaluate(rule, t, cost, request_id, charge);
        (!eval.allows() && !eval.charged(charge)).then(|| self.refuse(rule, &eval))
    }

    /// What the state holds at `now`, read under `rule`'s numbers.
    #[inline(always)] // on the memory store's checks (RuleState::from_words, decide_alone)
    fn plan(&self, rule: &Rule, now: u64) -> Plan {
        match &self.kind {
            StateKind::Log(state) => Plan::Log(state.plan(rule, now)),
            StateKind::Fixed(state) => Plan::Fixed(state.plan(rule, now)),
            StateKind::Counter(state) => Plan::Counter(state.plan(rule, now)),
            StateKind::Gcra(state) => Plan::Gcra(state.plan(rule, now)),
        }
    }

    /// Decides whether `cost` fits at `t` (clamped so time never runs backwards) in a check
    /// of mode `charge`. Reads only: what has expired is dropped by the next admission.
    #[inline(always)]
    pub(crate) fn evaluate(
        &self,
        rule: &Rule,
        t: u64,
        cost: u64,
        request_id: Option<&str>,
        charge: Charge,
    ) -> Evaluation {
        let now = t.max(self.latest);
        let units = units_of(rule, cost, charge);
        let plan = self.plan(rule, now);
        let repeat = request_id.and_then(|id| self.request_ids.admission(id, now));
        // The capacity bound comes first: the algorithms' arithmetic assumes units ≤ capacity.
        let verdict = match repeat {
            Some(release_at) => Verdict::Repeat { release_at },
            None if units > rule.capacity() => Verdict::Never,
            None if plan.fits(rule, now, units) => Verdict::Fits,
            None => Verdict::OverLimit,
        };
        Evaluation {
            now,
            cost,
            units,
            verdict,
            plan,
        }
    }

    /// What the request id of a check of `cost` in mode `charge` at `t` was used for, when
    /// this state still remembers it from a use that asked otherwise: a conflicting reuse
    /// (docs/SPEC.md, "Retries"), which a store refuses as an error before deciding anything.
    pub(crate) fn request_id_conflict(
        &self,
        t: u64,
        cost: u64,
        request_id: &str,
        charge: Charge,
    ) -> Option<RequestUse> {
        let now = t.max(self.latest);
        self.request_ids.conflict(
            Namespace::of(charge),
            request_id,
            now,
            RequestUse::new(charge, cost),
        )
    }

    /// Records an evaluation that allows (a repeat records nothing) and answers. A
    /// `reserve` (`charge`) also remembers its units under the request id.
    #[inline(always)] // on the memory store's checks, as `decide_alone`
    pub(crate) fn admit(
        &mut self,
        rule: &Rule,
        eval: &Evaluation,
        request_id: Option<&str>,
        charge: Charge,
    ) -> Decision {
        let Evaluation {
            now, cost, units, ..
        } = *eval;
        if let Verdict::Repeat { release_at } = eval.verdict {
            return Decision {
                allowed: true,
                delay: release_at.saturating_sub(now),
                ..self.refuse(rule, eval)
            };
        }
        let decision = match eval.plan {
            Plan::Log(p) => SlidingLogState::allowed(rule, p, units),
            Plan::Fixed(p) => FixedWindowState::allowed(rule, p, now, units),
            Plan::Counter(p) => SlidingCounterState::allowed(rule, p, now, units),
            Plan::Gcra(p) => GcraState::allowed(rule, p, now, units),
        };
        if cost > 0 {
            self.record(rule, eval.plan, now, cost);
            if let Some(id) = request_id {
                // A reservation outlives its units' window, for a request that streams longer,
                // and remembers where its units went, for its settle to give them back.
                let (reservation, remembered_for) = if charge == Charge::Reserve {
                    let reservation = Reservation {
                        units: cost,
                        at: now,
                        tat: now + decision.reset_after,
                    };
                    (
                        Some(reservation),
                        decision.reset_after.max(rule.window_micros()),
                    )
                } else {
                    (None, decision.reset_after)
                };
                self.request_ids.remember(
                    now,
                    Remembered {
                        request_id: id.into(),
                        namespace: Namespace::Admission,
                        used: RequestUse::new(charge, cost),
                        reservation,
                        expires_at: now + remembered_for,
                        release_at: now + decision.delay,
                    },
                );
            }
        }
        decision
    }

    /// Records `cost` units at `now` as `plan` read the state, and moves `latest` there
    /// (forgetting the ids expired by then).
    #[inline(always)] // on the memory store's checks, as `decide_alone`
    fn record(&mut self, rule: &Rule, plan: Plan, now: u64, cost: u64) {
        match (&mut self.kind, plan) {
            (StateKind::Log(s), Plan::Log(p)) => s.record(rule, p, now, cost),
            (StateKind::Fixed(s), Plan::Fixed(p)) => {
                s.record(p, cost);
            }
            (StateKind::Counter(s), Plan::Counter(p)) => s.record(rule, p, cost),
            (StateKind::Gcra(s), Plan::Gcra(p)) => s.record(rule, p, now, cost),
            _ => unreachable!("a plan is only ever passed back to the state that made it"),
        }
        self.latest = now;
        self.request_ids.forget_expired(now);
    }

    /// Decides a check of this rule alone: admits what allows, charges a refusal that
    /// `charge` charges, and refuses the rest.
    #[inline(always)] // on the memory store's checks, as `decide_alone`
    pub(crate) fn finish(
        &mut self,
        rule: &Rule,
        eval: &Evaluation,
        request_id: Option<&str>,
        charge: Charge,
    ) -> Decision {
        if eval.allows() {
            self.admit(rule, eval, request_id, charge)
        } else if eval.charged(charge) {
            self.charge_refusal(rule, eval)
        } else {
            self.refuse(rule, eval)
        }
    }

    /// Decides a check of this rule alone, in any mode: a check or a reservation is
    /// evaluated and finished, a report, settle or refund recorded. Answers the decision
    /// and whether the state now holds anything a fresh one would not (what a store needs
    /// to know to keep a new entry).
    // Inlined with what it calls on an admission (`finish`, `admit`, `record` and the
    // algorithms' own): called, the steps take 250 instructions to admit into a bucket, where
    // governor's whole check takes 440 (callgrind), enough to make the memory store's check
    // of 100,000 keys slower than governor's.
    #[inline(always)]
    pub(crate) fn decide_alone(
        &mut self,
        rule: &Rule,
        t: u64,
        cost: u64,
        request_id: Option<&str>,
        charge: Charge,
    ) -> (Decision, bool) {
        if charge.may_refuse() {
            let eval = self.evaluate(rule, t, cost, request_id, charge);
            let records = eval.records(eval.allows(), charge);
            (self.finish(rule, &eval, request_id, charge), records)
        } else {
            let decision = self.record_usage(rule, t, cost, request_id, charge);
            (decision, creates_entry(charge, cost))
        }
    }

    /// Records the units of a refusal that is charged ([`Evaluation::charged`]) and answers
    /// as the same refusal would right after the charge.
    fn charge_refusal(&mut self, rule: &Rule, eval: &Evaluation) -> Decision {
        let (StateKind::Fixed(state), Plan::Fixed(plan)) = (&mut self.kind, eval.plan) else {
            return self.refuse(rule, eval);
        };
        let charged = state.record(plan, eval.cost);
        self.latest = eval.now;
        FixedWindowState::refuse(rule, charged, eval.now, eval.retry_need())
    }

    /// Answers without recording: the rule's own refusal, or, when it fits but another rule
    /// refused the check, what its state says with nothing taken.
    #[inline(always)]
    pub(crate) fn refuse(&self, rule: &Rule, eval: &Evaluation) -> Decision {
        let retry = eval.retry_need();
        let now = eval.now;
        match (&self.kind, eval.plan) {
            (StateKind::Log(s), Plan::Log(p)) => s.refuse(rule, p, now, retry),
            (StateKind::Fixed(_), Plan::Fixed(p)) => FixedWindowState::refuse(rule, p, now, retry),
            (StateKind::Counter(s), Plan::Counter(p)) => s.refuse(rule, p, now, retry),
            (StateKind::Gcra(_), Plan::Gcra(p)) => GcraState::refuse(rule, p, now, retry),
            _ => unreachable!("an evaluation is only ever passed back to the state that made it"),
        }
    }

    /// What an evaluation that records nothing answers: a refusal, or, for one that fits
    /// (held back by another rule, or the standing of a usage mode), `allowed` with the
    /// "refused" formulas and nothing taken.
    pub(crate) fn unrecorded(&self, rule: &Rule, eval: &Evaluation) -> Decision {
        Decision {
            allowed: eval.allows(),
            ..self.refuse(rule, eval)
        }
    }

    /// The bytes this state holds on the heap (its own size is its holder's to count): a
    /// log's or a counter's box and buffer, and the request ids it remembers. Nothing for
    /// a fixed window or a bucket without ids, the common case, decided by two tests.
    #[inline(always)]
    pub(crate) fn heap_bytes(&self) -> usize {
        let kind = match &self.kind {
            StateKind::Log(state) => size_of::<SlidingLogState>() + state.buffer_bytes(),
            StateKind::Counter(state) => size_of::<SlidingCounterState>() + state.buffer_bytes(),
            StateKind::Fixed(_) | StateKind::Gcra(_) => 0,
        };
        kind + self.request_ids.heap_bytes()
    }

    /// Whether a check of `request_id` in mode `charge` at `t` finds the id remembered
    /// already (a retry, or a conflict): deciding it keeps no more bytes for the id.
    pub(crate) fn remembers(&self, t: u64, request_id: &str, charge: Charge) -> bool {
        self.request_ids
            .holds(Namespace::of(charge), request_id, t.max(self.latest))
    }

    /// Whether this state remembers any request id (an admission's, a reservation's): a
    /// state that does is never evicted, as forgetting it would count a retry twice.
    pub(crate) fn holds_request_ids(&self, now: u64) -> bool {
        self.request_ids.expires_at() > now
    }

    /// When this state was last written (µs): how recently its key was used.
    pub(crate) fn latest(&self) -> u64 {
        self.latest
    }

    /// The time (µs) from which this state is the same as no state at all: its units are
    /// gone and it remembers no request id.
    pub(crate) fn expires_at(&self, rule: &Rule) -> u64 {
        let units = match &self.kind {
            StateKind::Log(s) => s.expires_at(rule),
            StateKind::Fixed(s) => s.expires_at(rule),
            StateKind::Counter(s) => s.expires_at(rule),
            StateKind::Gcra(s) => s.expires_at(),
        };
        units.max(self.request_ids.expires_at())
    }
}

/// The next opening, for a cache of refusals: what a check of `units` under `rule` gets
/// right after an admission (`admitted`) that left fewer than `units`, computed from the
/// decision alone. That is the refusal with no other traffic; other traffic only takes
/// units, so with it the opening is later still. `None` for the sliding log and counter,
/// whose next opening depends on state the decision does not carry.
pub(crate) fn refusal_after_admission(
    rule: &Rule,
    admitted: Decision,
    units: u64,
) -> Option<Decision> {
    match rule.algorithm() {
        Algorithm::FixedWindow => Some(FixedWindowState::refusal_after(admitted)),
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            Some(GcraState::refusal_after(rule, admitted, units))
        }
        Algorithm::SlidingLog | Algorithm::SlidingCounter => None,
    }
}

/// Evaluates one check against several rules (docs/SPEC.md, "Several rules in one check"):
/// `states[i]` belongs to `rules[i]`, which costs `cost_of(i)`. Nothing is recorded; pass the evaluations to
/// [`finish_all`], which records only if every rule allows.
pub(crate) fn evaluate_all(
    rules: &[&Rule],
    states: &[&mut RuleState],
    t: u64,
    cost_of: impl Fn(usize) -> u64,
    request_id: Option<&str>,
    charge: Charge,
) -> Vec<Evaluation> {
    rules
        .iter()
        .zip(states)
        .enumerate()
        .map(|(i, (rule, state))| state.evaluate(rule, t, cost_of(i), request_id, charge))
        .collect()
}

/// Whether a check with these evaluations is allowed: every rule allows.
pub(crate) fn all_allow(evaluations: &[Evaluation]) -> bool {
    evaluations.iter().all(Evaluation::allows)
}

/// Records the check in every rule if all allow, or in none (but for the refusals `charge`
/// charges), and answers per rule. In a refused check a rule that would have allowed
/// reports `allowed = true` with nothing taken.
pub(crate) fn finish_all(
    rules: &[&Rule],
    states: &mut [&mut RuleState],
    evaluations: &[Evaluation],
    request_id: Option<&str>,
    charge: Charge,
) -> Vec<Decision> {
    let admit = all_allow(evaluations);
    rules
        .iter()
        .zip(states.iter_mut())
        .zip(evaluations)
        .map(|((rule, state), eval)| {
            if admit {
                state.admit(rule, eval, request_id, charge)
            } else if eval.charged(charge) {
                state.charge_refusal(rule, eval)
            } else {
                state.unrecorded(rule, eval)
            }
        })
        .collect()
}
