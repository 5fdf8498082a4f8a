//! Live bytes at the peak: for each process, the moment its sampled live total (the
//! Horvitz-Thompson bytes of its sampled blocks still live) was highest, and each of its
//! stacks' live samples at that moment. It is what heaptrack and memray open on: where the
//! memory was when there was most of it, which for a command that frees everything before
//! it exits is the only live view that is not empty.
//!
//! **Constant work per event.** Copying every stack's live set at each new peak would cost
//! a pass over all stacks per sample while a process grows. Instead each process counts its
//! peaks (`version`) and each stack remembers the version it last synced at: a stack that
//! has not changed since its process's latest peak holds, in its live set now, exactly what
//! it held then. So before a stack changes, if its process reached a peak since the stack
//! last synced, its live set (still as at that peak) is copied aside; reading a stack's
//! value at the peak takes the copy when the stack synced at the latest peak (it changed
//! after it), else its live set now.
//!
//! **What the bounds mean.** The moment is the one where the *estimated* total was highest,
//! chosen from the samples themselves, so the estimate then leans high: a program that
//! fills and empties its heap `K` times shows the highest of `K` noisy levels (for
//! `K` = 100, about 2.5 standard errors above its true level, outside a 95% interval most
//! of the time). The upper bound only gains from that; the lower bound is taken at the
//! confidence `1 − (1 − c)/K` instead of `c` (Bonferroni over the `K` fillings, each
//! an independent chance to look highest), with `K` = bytes allocated / bytes at the peak
//! (estimates, at least 1): one filling for a program that builds its heap once, as many as
//! the heap was replaced for a loop. The simulation (`stats::simulate::calibrate_peak`)
//! measures the coverage of the live bytes at the chosen moment and of the true peak.

use std::collections::HashMap;

use super::{
    estimate::{Estimates, SampleObs, Window},
    SampleSet,
};

/// Estimates of `at_peak` (samples live at a peak) with bounds at `confidence`, the lower
/// one widened for `fillings` chances to look highest (see the module doc).
pub fn estimate_at_peak(
    at_peak: &SampleSet,
    confidence: f64,
    fillings: f64,
    interval: u64,
) -> Estimates {
    let plain = at_peak.estimate(confidence, Window::RECORDING, interval);
    let wider = 1.0 - (1.0 - confidence) / fillings.max(1.0);
    let low = at_peak.estimate(wider, Window::RECORDING, interval);
    Estimates {
        bytes: super::Estimate {
            lower: low.bytes.lower,
            ..plain.bytes
        },
        objects: super::Estimate {
            lower: low.objects.lower,
            ..plain.objects
        },
        ..plain
    }
}

/// How many times a process filled its heap: its bytes allocated over its bytes at the
/// peak (estimates), at least 1.
pub fn fillings(allocated: f64, at_peak: f64) -> f64 {
    if at_peak > 0.0 {
        (allocated / at_peak).max(1.0)
    } else {
        1.0
    }
}

/// A process's peak so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessPeak {
    /// Its sampled live total now (estimated bytes).
    now: f64,
    /// The highest it has been (estimated bytes).
    pub bytes: f64,
    /// When (CLOCK_MONOTONIC ns).
    pub at_ns: u64,
    /// Peaks reached so far.
    version: u64,
}

/// A stack's live samples at its process's peak, as of the peak it last synced at.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct StackPeak {
    at_peak: SampleSet,
    version: u64,
}

/// Every process's peak and every stack's live samples then.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Peaks {
    processes: HashMap<u32, ProcessPeak>,
    stacks: Vec<StackPeak>,
}

impl Peaks {
    /// Stack `stack` of `pid`, whose live samples are `live` now, is about to change.
    pub fn before_change(&mut self, stack: usize, pid: u32, live: &SampleSet) {
        let version = self.processes.get(&pid).map_or(0, |p| p.version);
        if self.stacks.len() <= stack {
            // A stack new since the peak held nothing then.
            self.stacks.resize(
                stack + 1,
                StackPeak {
                    at_peak: SampleSet::default(),
                    version,
                },
            );
        }
        let entry = &mut self.stacks[stack];
        if entry.version != version {
            *entry = StackPeak {
                at_peak: *live,
                version,
            };
        }
    }

    /// A sample of `pid` became live (`added`) or left the live set (not `added`) at
    /// `at_ns`, after [`Self::before_change`] of its stack.
    pub fn after_change(&mut self, pid: u32, obs: SampleObs, added: bool, at_ns: u64) {
        let process = self.processes.entry(pid).or_default();
        let bytes = obs.weighted_bytes();
        process.now += if added { bytes } else { -bytes };
        if process.now > process.bytes {
            process.bytes = process.now;
            process.at_ns = at_ns;
            process.version += 1;
        }
    }

    /// Stack `stack` of `pid`'s live samples at its process's peak, `live` its live samples now.
    pub fn at_peak(&self, stack: usize, pid: u32, live: &SampleSet) -> SampleSet {
        let version = self.processes.get(&pid).map_or(0, |p| p.version);
        match self.stacks.get(stack) {
            Some(entry) if entry.version == version => entry.at_peak,
            // Unchanged since the peak (or never changed).
            _ => *live,
        }
    }

    /// `pid`'s peak (`None`: nothing of it was ever live).
    pub fn process(&self, pid: u32) -> Option<ProcessPeak> {
        self.processes.get(&pid).copied().filter(|p| p.version > 0)
    }

    /// Keeps the stacks `keep` keeps (by their index; the kept ones renumbered in order)
    /// and forgets the processes in `gone`.
    pub fn forget(&mut self, keep: impl Fn(usize) -> bool, gone: &std::collections::BTreeSet<u32>) {
        let mut index = 0;
        self.stacks.retain(|_| {
            index += 1;
            keep(index - 1)
        });
        self.processes.retain(|pid, _| !gone.contains(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(size: u64) -> SampleObs {
        SampleObs {
            size,
            offset: 0,
            interval: 1,
            weight: None,
        }
    }

    /// Replays `events` ((stack, pid, size, add?)) through `Peaks` and, beside it, keeps
    /// every stack's live set at every moment: the peak found the slow way must be the one
    /// `Peaks` reports, stack by stack.
    fn check(events: &[(usize, u32, u64, bool)]) {
        let stacks = events.iter().map(|e| e.0).max().unwrap_or(0) + 1;
        let mut live = vec![SampleSet::default(); stacks];
        let mut peaks = Peaks::default();
        let mut slow: HashMap<u32, (f64, Vec<SampleSet>)> = HashMap::new();
        for (at, &(stack, pid, size, add)) in events.iter().enumerate() {
            peaks.before_change(stack, pid, &live[stack]);
            if add {
                live[stack].add(obs(size));
            } else {
                live[stack].remove(obs(size));
            }
            peaks.after_change(pid, obs(size), add, at as u64);
            let total: f64 = (0..stacks)
                .filter(|&s| events.iter().any(|e| e.0 == s && e.1 == pid))
                .map(|s| live[s].horvitz_thompson().bytes)
                .sum();
            let best = slow.entry(pid).or_insert((0.0, Vec::new()));
            if total > best.0 {
                *best = (total, live.clone());
            }
        }
        for (pid, (bytes, then)) in slow {
            let peak = peaks.process(pid).expect("a peak");
            assert_eq!(peak.bytes, bytes, "pid {pid}");
            for (stack, set) in then.iter().enumerate() {
                if events.iter().any(|e| e.0 == stack && e.1 == pid) {
                    let got = peaks.at_peak(stack, pid, &live[stack]);
                    assert_eq!(
                        got.horvitz_thompson().bytes,
                        set.horvitz_thompson().bytes,
                        "pid {pid} stack {stack}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_program_that_frees_everything_keeps_what_it_held_at_its_peak() {
        // Stack 0 holds 100 and 50, stack 1 holds 30; then all is freed.
        check(&[
            (0, 1, 100, true),
            (1, 1, 30, true),
            (0, 1, 50, true),
            (0, 1, 100, false),
            (1, 1, 30, false),
            (0, 1, 50, false),
        ]);
    }

    #[test]
    fn stacks_new_or_changed_after_the_peak_show_what_they_held_then() {
        check(&[
            (0, 1, 500, true),
            (1, 1, 10, true),
            (0, 1, 500, false),
            (2, 1, 100, true), // new after the peak: held nothing then
            (1, 1, 10, false), // changed after it: held 10 then
            (1, 1, 20, true),
        ]);
    }

    #[test]
    fn each_process_has_its_own_peak() {
        check(&[
            (0, 1, 100, true),
            (1, 2, 10, true),
            (0, 1, 100, false),
            (1, 2, 500, true),
            (2, 1, 40, true),
            (1, 2, 10, false),
        ]);
    }

    #[test]
    fn random_sequences_agree_with_the_slow_way() {
        // A fixed pseudo-random walk (xorshift): allocs and frees over 6 stacks, 2 pids.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..50 {
            let mut held: Vec<(usize, u32, u64)> = Vec::new();
            let mut events = Vec::new();
            for _ in 0..60 {
                let r = next();
                if r % 3 == 0 && !held.is_empty() {
                    let (stack, pid, size) = held.swap_remove((r / 3) as usize % held.len());
                    events.push((stack, pid, size, false));
                } else {
                    let stack = (r >> 8) as usize % 6;
                    let pid = 1 + (stack % 2) as u32;
                    let size = 1 + (r >> 16) % 1000;
                    held.push((stack, pid, size));
                    events.push((stack, pid, size, true));
                }
            }
            check(&events);
        }
    }
}
