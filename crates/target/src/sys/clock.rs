//! The clocks allocscope reads, in nanoseconds, through one conversion: CLOCK_MONOTONIC
//! (the clock of `bpf_ktime_get_ns`, so ages of sampled blocks follow from the kernel's
//! timestamps) and a process's CPU clock (all its threads, those gone included).

/// Reads `clock` in nanoseconds; `None` if the kernel refuses (a process clock of a
/// process that is gone).
fn read(clock: libc::clockid_t) -> Option<u64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec it is given.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return None;
    }
    Some(now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// The CPU time of process `pid` (all its threads, those gone included) in nanoseconds;
/// `None` once it is gone.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid writes the clock id into the variable it is given.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } != 0 {
        return None;
    }
    read(clock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_advance_and_a_gone_process_has_none() {
        let (a, cpu_a) = (monotonic_ns(), process_cpu_ns(std::process::id()).unwrap());
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(monotonic_ns() > a);
        assert!(process_cpu_ns(std::process::id()).unwrap() > cpu_a);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(process_cpu_ns(pid), None, "reaped: no clock");
    }
}
