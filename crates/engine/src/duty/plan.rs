//! Duty cycling (`--max-overhead`), the plan: which time slots the probes are attached in.
//!
//! A process making a million allocation calls a second pays the uprobe trap on each,
//! whatever the program does: the only way to cost it less is to take the probes out for a
//! while. Time is cut into slots of equal length; slots are grouped into strata of `m`
//! slots, `m` chosen before the stratum starts, and exactly one slot of each stratum, drawn
//! uniformly, is on (probes attached, calls counted and sampled). Totals are then estimated
//! by [`crate::duty::estimate`] (each on slot scaled by its stratum's own work over its own).
//!
//! `m` comes from the budget, by feedback on the measured share: over a window of at
//! least a couple of seconds (and whole strata), the probes added `c · N_on` CPU time to
//! the targets (calls counted × the measured cost per call) and the targets used their
//! CPU time less that on their own work. The added share falls about as `1/m`: exactly so
//! for a target that runs at the same pace off as on (one waiting on I/O), as `1/(m − 1)`
//! for a CPU-bound one (its calls off are not slowed, so it makes more of them). So the
//! next `m` is the current one scaled by measured share over aimed share, the change
//! limited per step. The first choice, from a window with the probes always on, is
//! `⌈share / budget⌉` but at most `1 + ⌈1 / budget⌉`, which holds the budget for any
//! CPU-bound target however costly its calls (a malloc loop doing nothing else: 97 times
//! its own time while on); feedback raises it from there for targets that wait. This module
//! is pure: the recording measures and attaches ([`crate::recording`]).

/// Most slots per stratum: one on slot in 1000 at most (the cost of a probe-heavy target
/// is then ~0.1% of a fully probed one's; beyond, estimates would rest on too little).
pub(crate) const MAX_SLOTS: u32 = 1000;

/// One stratum of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stratum {
    /// Slots in it (1: always on, not sampled in time).
    pub slots: u32,
    /// Which of them is on (0-based).
    pub on_slot: u32,
}

impl Stratum {
    /// A stratum of `slots` slots, its on slot drawn from `random` (uniform over u64).
    pub(crate) fn draw(slots: u32, random: u64) -> Stratum {
        let slots = slots.clamp(1, MAX_SLOTS);
        Stratum {
            slots,
            // Modulo bias: at most 1000/2^64.
            on_slot: (random % u64::from(slots)) as u32,
        }
    }
}

/// What to do at the start of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotStart {
    /// The stratum that just ended (`None` in the first slot).
    pub ended: Option<Stratum>,
    /// The previous slot was on: close the gate and take the probes out (unless this one
    /// is on too).
    pub was_on: bool,
    /// This slot is on: attach the probes and open the gate.
    pub on: bool,
}

/// The slot plan as it unfolds.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    stratum: Stratum,
    /// Slot of the current stratum we are in; `None` before the first slot.
    slot: Option<u32>,
    strata: u64,
}

impl Default for Plan {
    fn default() -> Self {
        Plan::new()
    }
}

impl Plan {
    /// A plan whose first stratum is one slot, on: the cost is measured before any is
    /// skipped.
    pub(crate) fn new() -> Plan {
        Plan {
            stratum: Stratum {
                slots: 1,
                on_slot: 0,
            },
            slot: None,
            strata: 0,
        }
    }

    /// The stratum being played.
    pub(crate) fn stratum(&self) -> Stratum {
        self.stratum
    }

    /// Strata completed.
    pub(crate) fn strata(&self) -> u64 {
        self.strata
    }

    /// Whether the current slot is on.
    pub(crate) fn is_on(&self) -> bool {
        self.slot == Some(self.stratum.on_slot)
    }

    /// Moves to the next slot. When a stratum ends, the next one is `next()` (called only
    /// then: a controller's choice from what was measured so far).
    pub(crate) fn advance(&mut self, next: impl FnOnce() -> Stratum) -> SlotStart {
        let was_on = self.is_on();
        let mut ended = None;
        let slot = match self.slot {
            None => 0,
            Some(s) if s + 1 < self.stratum.slots => s + 1,
            Some(_) => {
                ended = Some(self.stratum);
                self.strata += 1;
                self.stratum = next();
                0
            }
        };
        self.slot = Some(slot);
        SlotStart {
            ended,
            was_on,
            on: self.is_on(),
        }
    }
}

/// The share of its own time the controller aims at, as a part of the budget (measuring
/// is noisy: aim a little under).
const AIM: f64 = 0.85;

/// Slots per stratum for the next window, from `current` and the added `share` of the
/// targets' own CPU time measured over the last one (infinite when they did no work of
/// their own: all of their time went to the probes).
pub(crate) fn next_slots(budget: f64, current: u32, share: f64) -> u32 {
    if budget.is_nan() || budget <= 0.0 || share.is_nan() {
        return current.clamp(1, MAX_SLOTS);
    }
    if current <= 1 {
        if share <= budget {
            return 1;
        }
        let cpu_bound = 1.0 + (1.0 / budget).ceil();
        return (share / budget)
            .ceil()
            .min(cpu_bound)
            .min(f64::from(MAX_SLOTS)) as u32;
    }
    let m = f64::from(current);
    if (AIM * 0.8 * budget..=budget).contains(&share) {
        return current;
    }
    let wanted = (m * share / (AIM * budget)).ceil();
    let limited = if wanted.is_nan() {
        m
    } else {
        wanted.clamp((m / 2.0).floor(), m * 8.0)
    };
    limited.clamp(1.0, f64::from(MAX_SLOTS)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The added share of a target at `m` slots per stratum: each call costs `cost` while
    /// on and comes with `own` of its own work; `cpu_bound` ones make their calls as fast
    /// as they can (more off than on), others at the same pace.
    fn share(m: u32, cost: f64, own: f64, cpu_bound: bool) -> f64 {
        let m = f64::from(m);
        let (on, off) = if cpu_bound {
            (1.0 / (own + cost), (m - 1.0) / own)
        } else {
            (1.0, m - 1.0)
        };
        cost * on / (own * (on + off))
    }

    /// Runs the controller on a target for `windows` windows: the shares it ended at.
    fn settle(budget: f64, cost: f64, own: f64, cpu_bound: bool, windows: usize) -> Vec<f64> {
        let mut m = 1;
        let mut shares = Vec::new();
        for _ in 0..windows {
            let now = share(m, cost, own, cpu_bound);
            shares.push(now);
            m = next_slots(budget, m, now);
        }
        shares
    }

    #[test]
    fn a_cheap_target_is_always_on() {
        // 800 ns per call against 100 µs of its own work per call: 0.8%.
        assert_eq!(next_slots(0.05, 1, share(1, 800.0, 100_000.0, false)), 1);
        assert_eq!(next_slots(0.05, 1, 0.0), 1);
        assert_eq!(next_slots(0.05, 7, f64::NAN), 7);
    }

    #[test]
    fn the_budget_holds_within_a_few_windows_and_not_far_under() {
        // (probe cost per call, own work per call): sqlite3, a malloc loop, python3, an
        // allocation now and then.
        let targets = [
            (850.0, 570.0),
            (870.0, 9.0),
            (900.0, 1500.0),
            (800.0, 20_000.0),
        ];
        for budget in [0.01, 0.02, 0.05, 0.10] {
            for (cost, own) in targets {
                for cpu_bound in [true, false] {
                    let shares = settle(budget, cost, own, cpu_bound, 12);
                    let last = &shares[4..];
                    let case = format!("{budget} {cost} {own} {cpu_bound}: {shares:.4?}");
                    if cost / own <= budget {
                        assert!(shares.iter().all(|&s| s <= budget), "{case}");
                        continue;
                    }
                    let floor = share(MAX_SLOTS, cost, own, cpu_bound);
                    if floor > budget {
                        // A malloc loop at 1% waiting on I/O: as few on slots as there are.
                        assert!(last.iter().all(|&s| s <= floor * 1.0001), "{case}");
                        continue;
                    }
                    assert!(last.iter().all(|&s| s <= budget * 1.0001), "{case}");
                    assert!(last.iter().all(|&s| s >= budget * 0.3), "{case}");
                }
            }
        }
        // The first choice holds a CPU-bound storm at once.
        let first = next_slots(0.05, 1, share(1, 870.0, 9.0, true));
        assert_eq!(first, 21);
        assert!(share(first, 870.0, 9.0, true) <= 0.05);
    }

    #[test]
    fn one_slot_per_stratum_is_on_and_strata_change_when_they_end() {
        let mut plan = Plan::new();
        let first = plan.advance(|| unreachable!());
        assert_eq!(
            first,
            SlotStart {
                ended: None,
                was_on: false,
                on: true
            }
        );
        let mut sizes = [3u32, 5, 1].into_iter();
        let mut draws = 0;
        let mut on_per_stratum = vec![1];
        let mut current = 1;
        for _ in 0..9 {
            let start = plan.advance(|| {
                draws += 1;
                Stratum::draw(sizes.next().unwrap_or(2), 7 + draws)
            });
            if start.ended.is_some() {
                on_per_stratum.push(0);
                current = plan.stratum().slots;
            }
            *on_per_stratum.last_mut().unwrap() += u32::from(start.on);
            assert!(plan.slot.is_some_and(|slot| slot < current));
        }
        // 1 + 3 + 5 slots, then the 1-slot stratum: one on slot in each.
        assert_eq!(on_per_stratum, vec![1, 1, 1, 1]);
        assert_eq!(plan.strata(), 3);
    }

    #[test]
    fn the_on_slot_is_uniform() {
        let mut seen = [0u32; 7];
        for random in 0..7000u64 {
            seen[Stratum::draw(7, random.wrapping_mul(0x9E37_79B9_7F4A_7C15)).on_slot as usize] +=
                1;
        }
        assert!(seen.iter().all(|&n| (900..=1100).contains(&n)), "{seen:?}");
        assert_eq!(Stratum::draw(0, 5).slots, 1);
        assert_eq!(Stratum::draw(5000, 5).slots, MAX_SLOTS);
    }
}
