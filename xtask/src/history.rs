//! Commit messages: a subject of at most 72 characters, the why in the body (`git log
//! --oneline`, `git shortlog` and every review tool show the subject alone). Checked for the
//! commits after [`RULE_SINCE`], the last commit before the rule; the history before it is
//! published and stays as it is.

use std::{path::Path, process::Command};

use anyhow::{bail, Context as _};

/// The last commit before the rule.
const RULE_SINCE: &str = "237ad239149713e71bbc3af3d4fd6a1b9d27808f";

/// The longest subject allowed, in characters.
pub const MAX_SUBJECT: usize = 72;

/// The subjects of `log` (one per line, `HASH SUBJECT`) over [`MAX_SUBJECT`].
pub fn long_subjects(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| {
            let subject = line.split_once(' ').map_or("", |(_, s)| s);
            subject.chars().count() > MAX_SUBJECT
        })
        .collect()
}

/// Fails, naming each, on a commit after [`RULE_SINCE`] whose subject is too long.
pub fn check(workspace: &Path) -> anyhow::Result<()> {
    if !workspace.join(".git").exists() {
        println!("xtask: not a git checkout: commit subjects not checked");
        return Ok(());
    }
    let output = Command::new("git")
        .args(["log", "--no-merges", "--format=%h %s"])
        .arg(format!("{RULE_SINCE}..HEAD"))
        .current_dir(workspace)
        .output()
        .context("running git log")?;
    anyhow::ensure!(
        output.status.success(),
        "git log {RULE_SINCE}..HEAD failed (a shallow clone?): {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let log = String::from_utf8_lossy(&output.stdout);
    let long = long_subjects(&log);
    if !long.is_empty() {
        bail!(
            "commit subjects over {MAX_SUBJECT} characters (the why goes in the body):\n  {}",
            long.join("\n  ")
        );
    }
    println!(
        "xtask: {} commit subjects since the rule, each at most {MAX_SUBJECT} characters",
        log.lines().count()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_over_the_limit_is_named_and_one_at_it_is_not() {
        let at = "x".repeat(MAX_SUBJECT);
        let over = "é".repeat(MAX_SUBJECT + 1);
        let log = format!("abc123 {at}\ndef456 {over}\n");
        assert_eq!(long_subjects(&log), [format!("def456 {over}")]);
    }
}
