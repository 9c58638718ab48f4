//! A check's mode: what it does with its cost.

/// What a check charges: its mode (docs/SPEC.md, "A check and its cost", and "Usage:
/// reports, reservations, settlements and refunds").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Charge {
    /// The mode `check`: only an admission records units; a refusal changes no state.
    #[default]
    Check,
    /// A refused check records its units too, in each fixed-window limit that refused it,
    /// as envoyproxy/ratelimit counts (it increments, then compares). Limits that would
    /// have allowed record nothing when another refused, and the other algorithms record
    /// nothing on a refusal (docs/SPEC.md, "Charging refusals").
    CheckChargingRefusals,
    /// The mode `reserve`: a check (`Check`) whose admission also remembers its units
    /// under the request id, for a later `Settle`. Needs a request id.
    Reserve,
    /// The mode `report`: records the cost whatever the limit says (the key may go into
    /// debt); never refused; answers the standing.
    Report,
    /// The mode `settle`: the cost is what the request really cost; records the difference
    /// from its reservation (by request id: a report of the excess or a refund of the
    /// unused part), or, without a live reservation, reports the whole cost. Needs a
    /// request id.
    Settle,
    /// The mode `refund`: gives back up to the cost of what the key holds, newest first;
    /// never refused; answers the standing.
    Refund,
}

impl Charge {
    /// Every mode, in the order docs/SPEC.md lists them.
    pub const ALL: [Charge; 6] = [
        Charge::Check,
        Charge::CheckChargingRefusals,
        Charge::Reserve,
        Charge::Report,
        Charge::Settle,
        Charge::Refund,
    ];

    /// The mode's name in the HTTP API and the replay format: `check`, `check` (envoy's
    /// counting has no name of its own there), `reserve`, `report`, `settle`, `refund`.
    pub fn name(self) -> &'static str {
        match self {
            Charge::Check | Charge::CheckChargingRefusals => "check",
            Charge::Reserve => "reserve",
            Charge::Report => "report",
            Charge::Settle => "settle",
            Charge::Refund => "refund",
        }
    }

    /// The names [`Charge::from_name`] takes, as an error lists what it expected.
    pub const NAMES: &'static str = "check, reserve, report, settle or refund";

    /// The mode named `name` (`check` is [`Charge::Check`]).
    pub fn from_name(name: &str) -> Option<Charge> {
        Some(match name {
            "check" => Charge::Check,
            "reserve" => Charge::Reserve,
            "report" => Charge::Report,
            "settle" => Charge::Settle,
            "refund" => Charge::Refund,
            _ => return None,
        })
    }

    /// Whether the mode can be refused: `check`, envoy's counting and `reserve` can; a
    /// report, a settle and a refund never are, and always reach the store.
    pub fn may_refuse(self) -> bool {
        matches!(
            self,
            Charge::Check | Charge::CheckChargingRefusals | Charge::Reserve
        )
    }

    /// Whether the mode needs a request id (`reserve` and `settle`).
    pub fn needs_request_id(self) -> bool {
        matches!(self, Charge::Reserve | Charge::Settle)
    }

    /// Whether the mode can give units back (`settle`, `refund`), so that a refusal cached
    /// before it may no longer hold.
    pub(crate) fn may_free_units(self) -> bool {
        matches!(self, Charge::Settle | Charge::Refund)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lists_every_mode_from_name_takes() {
        for charge in Charge::ALL {
            assert!(Charge::NAMES.contains(charge.name()), "{charge:?}");
            assert!(Charge::from_name(charge.name()).is_some(), "{charge:?}");
        }
        let listed = Charge::NAMES.replace(" or ", ", ");
        assert!(listed.split(", ").all(|n| Charge::from_name(n).is_some()));
    }
}
