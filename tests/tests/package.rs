//! The Debian package `cargo xtask dist` builds, installed as a fleet installs it
//! (`apt-get install ./….deb`), used, and removed.

use std::{path::PathBuf, process::Command};

use tests::{bpf_available, fixture, workspace, TempDir};

fn the_deb() -> PathBuf {
    let dist = workspace().join("target/dist");
    std::fs::read_dir(&dist)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| panic!("no .deb in {}: run `cargo xtask dist`", dist.display()))
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{command:?} failed:\n{text}");
    text
}

#[test]
fn the_debian_package_installs_runs_and_removes() {
    if !bpf_available("the Debian package") {
        return;
    }
    let deb = the_deb();
    run(Command::new("apt-get")
        .args(["install", "-y", "--reinstall", "--no-install-recommends"])
        .arg(&deb)
        .env("DEBIAN_FRONTEND", "noninteractive"));
    let files = run(Command::new("dpkg").args(["-L", "allocscope"]));
    for expected in [
        "/usr/bin/allocscope",
        "/usr/lib/allocscope/libsampler_preload.so",
        "/lib/systemd/system/allocscope-agent.service",
        "/etc/default/allocscope-agent",
        "/usr/share/man/man1/allocscope.1.gz",
        "/usr/share/man/man1/allocscope-agent.1.gz",
        "/usr/share/man/man1/allocscope-record.1.gz",
        "/usr/share/bash-completion/completions/allocscope",
        "/usr/share/zsh/vendor-completions/_allocscope",
        "/usr/share/fish/vendor_completions.d/allocscope.fish",
        "/usr/share/doc/allocscope/agent.md",
    ] {
        assert!(
            files.lines().any(|l| l == expected),
            "{expected} not installed:\n{files}"
        );
    }
    let version = run(Command::new("/usr/bin/allocscope").arg("--version"));
    assert!(version.starts_with("allocscope "), "{version}");
    // Stripped: no debug sections left in the installed binary.
    let sections = run(Command::new("readelf").args(["-S", "/usr/bin/allocscope"]));
    assert!(
        !sections.contains(".debug_info"),
        "the installed binary is not stripped"
    );
    let page =
        run(Command::new("sh").args(["-c", "zcat /usr/share/man/man1/allocscope-agent.1.gz"]));
    assert!(page.contains(".TH") && page.contains("pyroscope"), "{page}");
    let bash =
        std::fs::read_to_string("/usr/share/bash-completion/completions/allocscope").unwrap();
    assert!(bash.contains("agent") && bash.contains("--otlp-grpc"));
    // The unit is valid as systemd reads it.
    run(Command::new("systemd-analyze")
        .args(["verify", "/lib/systemd/system/allocscope-agent.service"]));
    // The library loads into a program started by hand.
    run(Command::new("/bin/true").env("LD_PRELOAD", "/usr/lib/allocscope/libsampler_preload.so"));

    // The installed binary does its job: the agent writes each period of a command.
    let dir = TempDir::new("package");
    let out = dir.path("periods");
    run(Command::new("/usr/bin/allocscope")
        .args(["agent", "--period", "1s", "--spool-in-memory", "--out-dir"])
        .arg(&out)
        .arg("--")
        .arg(fixture("workload", &[]))
        .arg("3000"));
    let written = tests::files_under(&out);
    assert!(!written.is_empty());
    let profile = tests::read_profile(&written[0]);
    assert!(
        profile["processes"][0]["command"] == "workload",
        "{}",
        profile["processes"]
    );

    run(Command::new("apt-get")
        .args(["remove", "--purge", "-y", "allocscope"])
        .env("DEBIAN_FRONTEND", "noninteractive"));
    assert!(!std::path::Path::new("/usr/bin/allocscope").exists());
}
