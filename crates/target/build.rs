//! Builds what the `allocscope` binary embeds, into OUT_DIR:
//! * the eBPF programs (sampler-ebpf) with nightly + bpf-linker, which `probe::attach`
//!   loads (`cargo xtask setup` installs what this needs);
//! * the in-process front end (sampler-preload, a shared library) in release mode with
//!   frame pointers (the kernel's frame-pointer walk starts inside it), in two segments
//!   rather than three (read-only data with the code), without the standard library
//!   (`panic=abort`: it needs no unwinder, so no `libgcc_s.so.1`), which `preload` hands
//!   to the commands it starts.
use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _};

fn main() -> anyhow::Result<()> {
    let package = aya_build::Package {
        name: "sampler-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../../sampler-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())?;
    build_preload()
}

fn build_preload() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    for watched in [
        "sampler-preload/src",
        "sampler-preload/Cargo.toml",
        "sampler-common/src",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let target_dir = out.join("preload-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let flags = [
        "-C",
        "force-frame-pointers=yes",
        "-C",
        "strip=debuginfo",
        // Read-only data in the code's segment: one mapping fewer for the loader to make,
        // split and tear down in every process the library is loaded into (part of each
        // short process's start under `record`, docs/performance.md, "Many short processes:
        // builds and scripts"). RELRO is kept.
        "-C",
        "link-arg=-Wl,--no-rosegment",
        // No standard library, so panics abort (see the library's own docs).
        "-C",
        "panic=abort",
    ]
    .join("\x1f");
    let status = Command::new(cargo)
        .current_dir(&root)
        .args([
            "rustc",
            "--release",
            "--lib",
            "-p",
            "sampler-preload",
            "--target-dir",
        ])
        .arg(&target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .env("CARGO_ENCODED_RUSTFLAGS", flags)
        .status()
        .context("running cargo for sampler-preload")?;
    if !status.success() {
        bail!("building sampler-preload failed: {status}");
    }
    let built = target_dir.join("release/libsampler_preload.so");
    std::fs::copy(&built, out.join("libsampler_preload.so"))
        .with_context(|| format!("copying {}", built.display()))?;
    Ok(())
}
