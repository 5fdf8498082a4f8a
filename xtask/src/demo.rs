//! The demo: record the bundled workload (tests/fixtures/workload.c, sites of known sizes
//! and counts, listed at the top of that file) and write its JSON profile.

use std::process::{Command, Stdio};

use crate::run::{cargo, fixture, is_root, status, workspace};

pub fn run() -> anyhow::Result<()> {
    // What the demo runs, not what the tests need (chromium, Go, Node: ~880 MB).
    crate::setup::build_only()?;
    status(cargo().args(["build", "--release"]))?;
    let workload = fixture("workload")?;
    let root = workspace();
    let out_dir = root.join("target/demo");
    std::fs::create_dir_all(&out_dir)?;
    let allocscope = root.join("target/release/allocscope");
    let mut command = if is_root() {
        Command::new(&allocscope)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg(&allocscope);
        sudo
    };
    command
        .args(["record", "--interval", "64KiB", "-o"])
        .arg(out_dir.join("heap.json"))
        .arg("--")
        .arg(&workload)
        .arg("2000")
        // allocscope's summary is on stderr; the workload's own lines (stdout, which the
        // command inherits) would be mixed into it.
        .stdout(Stdio::null());
    status(&mut command)?;
    eprintln!(
        "\nxtask: true totals per site: the header of tests/fixtures/workload.c, x2000 rounds\n       \
         profile: {}/heap.json",
        out_dir.display()
    );
    Ok(())
}
