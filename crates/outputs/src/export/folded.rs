//! Folded stacks, the input of flamegraph.pl and inferno: one line per stack,
//! `[cgroup;]command (pid);root;…;leaf value`, value = the chosen estimate, rounded. The
//! cgroup, when known, is the outermost frame, so a flame graph groups a container's or a
//! systemd unit's processes.

use std::{collections::BTreeMap, io::Write};

use super::Value;
use crate::{
    format::{frame_name, sanitize},
    schema::Profile,
};

/// Writes one line per distinct folded stack (stacks whose names coincide are summed).
pub(crate) fn write(profile: &Profile, value: Value, out: &mut dyn Write) -> std::io::Result<()> {
    for (path, amount) in lines(profile, value) {
        writeln!(out, "{path} {amount}")?;
    }
    Ok(())
}

/// The folded lines as (path, value), sorted by path, without zero values.
pub(crate) fn lines(profile: &Profile, value: Value) -> Vec<(String, u64)> {
    let processes = profile.process_labels();
    let mut lines: BTreeMap<String, f64> = BTreeMap::new();
    for stack in &profile.stacks {
        let (command, cgroup) = processes.get(&stack.pid).copied().unwrap_or(("?", None));
        let mut path: Vec<String> = cgroup.map(sanitize).into_iter().collect();
        path.push(sanitize(&format!("{command} ({})", stack.pid)));
        path.extend(stack.frames.iter().rev().map(frame_name));
        *lines.entry(path.join(";")).or_default() += value.of(stack);
    }
    lines
        .into_iter()
        .map(|(path, amount)| (path, amount.round() as u64))
        .filter(|(_, amount)| *amount > 0)
        .collect()
}
