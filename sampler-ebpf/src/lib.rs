#![no_std]
//! Library face of the eBPF crate: empty on purpose. allocscope-target's build script depends on
//! this crate so cargo rebuilds the user binary when the eBPF sources change; the programs
//! themselves are the `sampler` binary, built for bpfel-unknown-none by aya-build.
