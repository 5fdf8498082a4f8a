//! Builds the eBPF programs (sampler-ebpf) with nightly + bpf-linker and places the object in
//! OUT_DIR, where `probe::load` embeds it. `cargo xtask setup` installs what this needs.
fn main() -> anyhow::Result<()> {
    let package = aya_build::Package {
        name: "sampler-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../sampler-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}
