//! The machine: its available memory (to bound what a recording may hold) and its name (the
//! agent's `host.name`).

/// `MemAvailable` of /proc/meminfo, in bytes.
pub fn memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    super::process::status_field(&text, "MemAvailable")?
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()
        .map(|kib| kib * 1024)
}

/// This host's name (the kernel's, `hostname`).
pub fn name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_machine_has_memory_and_a_name() {
        assert!(super::memory_available().unwrap() > 1 << 20);
        assert!(!super::name().unwrap().is_empty());
    }
}
