//! Calibrating the uprobe trap: time a function of our own, then time it again with a
//! probe on it that runs the cheapest program there is (count the call), in our own
//! process only. The difference, less that program's measured run time, is what the
//! kernel charges per hit for the breakpoint, the exception and the return to user space.
//!
//! The probed function starts with `push rbp`, an instruction the kernel emulates, as at
//! the allocator entries we probe (an instruction it must single-step costs several times
//! more: [`crate::probe::prologue`]). It takes a while at start (docs/performance.md, "What
//! a recording cost, measured").

use std::time::Instant;

use anyhow::Context as _;

use super::{Trap, TrapSource};
use crate::probe::{attach::Probes, runs};
use crate::sys::maps;

/// Calls timed per round.
const CALLS: u32 = 1000;
/// Rounds per measurement; the fastest is kept. Many short rounds: on a loaded machine
/// (tests running beside it) one of 5 rounds of 4 ms was seldom left alone by the
/// scheduler, and the trap came out far above its quiet figure (docs/performance.md,
/// "Figures quoted from the code"), which made the modelled
/// cost of a recording exceed its target's whole CPU time.
const ROUNDS: usize = 20;

/// The probed function: it does nothing, starting with an emulated instruction.
#[unsafe(naked)]
extern "C" fn trap_target() {
    core::arch::naked_asm!("push rbp", "pop rbp", "ret")
}

/// Nanoseconds per call of [`trap_target`] in the fastest of [`ROUNDS`] rounds: preemption
/// and interrupts only add time, so on a busy machine the fastest round is the truest (a
/// median took far longer for the trap under CI's parallel tests than when quiet
/// (docs/performance.md, "Figures quoted from the code"), and the overhead it reported then
/// exceeded the CPU time the target used).
fn time_calls() -> f64 {
    let target = std::hint::black_box(trap_target as extern "C" fn());
    let rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..CALLS {
                target();
            }
            started.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .collect();
    rounds.into_iter().fold(f64::INFINITY, f64::min)
}

/// The trap cost on this machine, or the modelled one if it cannot be measured (logged).
pub fn calibrate(probes: &mut Probes) -> Trap {
    match measure(probes) {
        Ok(trap) => {
            log::debug!("uprobe trap calibrated: {:.0} ns per hit", trap.ns);
            trap
        }
        Err(e) => {
            log::warn!(
                "could not calibrate the uprobe trap ({e:#}); overhead figures use the \
                 modelled {:.0} ns",
                Trap::MODELLED.ns
            );
            Trap::MODELLED
        }
    }
}

fn measure(probes: &mut Probes) -> anyhow::Result<Trap> {
    let address = trap_target as *const () as usize as u64;
    let vmas = maps::read(std::process::id()).context("reading our own maps")?;
    let vma = vmas
        .iter()
        .find(|v| v.file_offset(address).is_some())
        .context("our own code is not in our maps")?;
    let offset = vma.file_offset(address).unwrap_or_default();
    let path = vma.file_in(std::process::id());
    let bare = time_calls();
    let link = probes
        .attach_bare(&path, offset)
        .context("probing our own function")?;
    // Timed with statistics off, as the targets run most of the time.
    let probed = time_calls();
    // The reference program's own run time, measured with statistics on: it includes the
    // share of their clock reads that lands inside a run, as our programs' measured time
    // does, so subtracting it here and adding theirs later counts that share once.
    let program_ns = {
        let _stats = runs::enable();
        let before = probes.bare_runs();
        time_calls();
        let after = probes.bare_runs();
        match (before, after) {
            (Some(before), Some(after)) => {
                let runs = after.since(before);
                let expected = u64::from(CALLS) * ROUNDS as u64;
                anyhow::ensure!(
                    runs.runs == expected,
                    "the probe ran {} times for {expected} calls",
                    runs.runs
                );
                runs.run_ns as f64 / runs.runs as f64
            }
            _ => 0.0,
        }
    };
    link.close_in_background();
    let ns = probed - bare - program_ns;
    anyhow::ensure!(
        ns > 0.0,
        "a probed call took {probed:.0} ns, an unprobed one {bare:.0} ns"
    );
    Ok(Trap {
        ns,
        source: TrapSource::Calibrated,
    })
}
