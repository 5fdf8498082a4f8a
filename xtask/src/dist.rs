//! `cargo xtask dist`: the Debian package a fleet installs (`apt-get install ./….deb`).
//!
//! Built with `dpkg-deb` from a staged tree rather than cargo-deb: the tree is a handful
//! of files, and `dpkg-deb` is already on every Debian machine (cargo-deb would be one more
//! tool to build and pin). The package holds the stripped binary (the in-process library
//! is embedded in it, and also installed as a file, `allocscope generate library`, for
//! services started with it in `LD_PRELOAD`), the agent's systemd unit and its defaults file (a conffile), the man
//! pages and the bash, zsh and fish completions the binary writes (`allocscope generate`),
//! and the docs. Written to `target/dist/allocscope_VERSION_amd64.deb`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

use crate::run::{output, status};

/// Builds the package; returns its path.
pub fn run() -> anyhow::Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?
        .to_owned();
    status(
        Command::new("cargo")
            .args([
                "build",
                "--release",
                "-p",
                "sampler-user",
                "-p",
                "sampler-preload",
            ])
            .current_dir(&root),
    )?;
    let version = output(Command::new(root.join("target/release/allocscope")).arg("--version"))
        .context("running the built allocscope --version")?;
    let version = version
        .split_whitespace()
        .nth(1)
        .context("allocscope --version said no version")?
        .to_owned();
    let stage = root.join("target/dist/stage");
    let _ = std::fs::remove_dir_all(&stage);
    stage_files(&root, &stage)?;
    generated(&root, &stage)?;
    control(&stage, &version)?;
    let deb = root.join(format!("target/dist/allocscope_{version}_amd64.deb"));
    status(
        Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group", "-Zxz"])
            .arg(&stage)
            .arg(&deb),
    )?;
    eprintln!("xtask: wrote {}", deb.display());
    Ok(deb)
}

/// Copies `from` (under the workspace) to `to` (under the stage) with `mode`.
fn place(root: &Path, stage: &Path, from: &str, to: &str, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let target = stage.join(to.trim_start_matches('/'));
    std::fs::create_dir_all(target.parent().context("no parent")?)?;
    std::fs::copy(root.join(from), &target)
        .with_context(|| format!("copying {from} to {}", target.display()))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn stage_files(root: &Path, stage: &Path) -> anyhow::Result<()> {
    place(
        root,
        stage,
        "target/release/allocscope",
        "/usr/bin/allocscope",
        0o755,
    )?;
    status(Command::new("strip").arg(stage.join("usr/bin/allocscope")))?;
    // The library allocscope embeds (frame pointers kept, debug info stripped): the one
    // `record -- CMD` loads, not the crate's own build, which has no frame pointers.
    status(
        Command::new(root.join("target/release/allocscope"))
            .args(["generate", "library"])
            .arg(stage.join("usr/lib/allocscope")),
    )?;
    for (from, to, mode) in [
        (
            "packaging/allocscope-agent.service",
            "/lib/systemd/system/allocscope-agent.service",
            0o644,
        ),
        (
            "packaging/allocscope-agent.default",
            "/etc/default/allocscope-agent",
            0o600,
        ),
        ("README.md", "/usr/share/doc/allocscope/README.md", 0o644),
        ("docs/agent.md", "/usr/share/doc/allocscope/agent.md", 0o644),
        (
            "docs/preload.md",
            "/usr/share/doc/allocscope/preload.md",
            0o644,
        ),
        (
            "packaging/copyright",
            "/usr/share/doc/allocscope/copyright",
            0o644,
        ),
    ] {
        place(root, stage, from, to, mode)?;
    }
    Ok(())
}

/// Man pages (gzipped, as Debian wants) and completions, from the binary itself.
fn generated(root: &Path, stage: &Path) -> anyhow::Result<()> {
    let binary = root.join("target/release/allocscope");
    let man = stage.join("usr/share/man/man1");
    status(Command::new(&binary).args(["generate", "man"]).arg(&man))?;
    for page in std::fs::read_dir(&man)? {
        status(Command::new("gzip").args(["-9n"]).arg(page?.path()))?;
    }
    let completions = root.join("target/dist/completions");
    status(
        Command::new(&binary)
            .args(["generate", "completions"])
            .arg(&completions),
    )?;
    for (file, to) in [
        (
            "allocscope.bash",
            "/usr/share/bash-completion/completions/allocscope",
        ),
        (
            "_allocscope",
            "/usr/share/zsh/vendor-completions/_allocscope",
        ),
        (
            "allocscope.fish",
            "/usr/share/fish/vendor_completions.d/allocscope.fish",
        ),
    ] {
        place(
            root,
            stage,
            &format!("target/dist/completions/{file}"),
            to,
            0o644,
        )?;
    }
    Ok(())
}

fn control(stage: &Path, version: &str) -> anyhow::Result<()> {
    let debian = stage.join("DEBIAN");
    std::fs::create_dir_all(&debian)?;
    let installed_kib: u64 = walk(stage)?
        .iter()
        .map(|f| f.metadata().map_or(0, |m| m.len()))
        .sum::<u64>()
        / 1024;
    std::fs::write(
        debian.join("control"),
        format!(
            "Package: allocscope\n\
             Version: {version}\n\
             Architecture: amd64\n\
             Maintainer: allocscope developers <allocscope@localhost>\n\
             Installed-Size: {installed_kib}\n\
             Depends: libc6 (>= 2.36)\n\
             Section: devel\n\
             Priority: optional\n\
             Description: sampling allocation profiler (eBPF) with confidence bounds\n \
             allocscope samples allocated bytes of running processes with eBPF uprobes or an\n \
             in-process sampler, and turns the samples into per-stack estimates with\n \
             confidence bounds: record, top, HTML reports, pprof, and an agent that sends\n \
             profiles to Grafana Pyroscope and OpenTelemetry (OTLP profiles).\n"
        ),
    )?;
    std::fs::write(debian.join("conffiles"), "/etc/default/allocscope-agent\n")?;
    Ok(())
}

fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(walk(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}
