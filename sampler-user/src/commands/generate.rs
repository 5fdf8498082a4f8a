//! `allocscope generate man|completions|library DIR`: the man pages (clap_mangen) and the
//! shell completions (clap_complete) a package installs, made from the same definitions
//! the command line parses with, so they never drift from it; and the in-process sampler
//! allocscope embeds, for services started with it preloaded, byte for byte the library
//! `record -- CMD` loads (built with frame pointers: the kernel's frame-pointer walk
//! starts inside it; a `cargo build` of the crate alone leaves them out).

use std::path::Path;

use anyhow::Context as _;

use crate::cli::{GenerateArgs, GenerateWhat};

/// Writes what `args` asks for into its directory.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    match args.what {
        GenerateWhat::Man => man_pages(&args.dir),
        GenerateWhat::Completions => completions(&args.dir),
        GenerateWhat::Library => library(&args.dir),
    }
}

/// Writes `dir/libsampler_preload.so` (replacing a regular file only), readable by every
/// user a service may run as.
fn library(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let path = dir.join(crate::preload::place::LIBRARY_NAME);
    crate::outfile::write_replacing(&path, |out| out.write_all(crate::preload::library_bytes()))
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|file| file.set_permissions(std::fs::Permissions::from_mode(0o644)))
        .with_context(|| format!("making {} readable", path.display()))?;
    println!("{}", path.display());
    Ok(())
}

fn man_pages(dir: &Path) -> anyhow::Result<()> {
    let command = crate::help::command();
    write_page(dir, "allocscope", command.clone())?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("allocscope-{}", sub.get_name());
        write_page(dir, &name, sub.clone().name(name.clone()))?;
    }
    Ok(())
}

fn write_page(dir: &Path, name: &str, command: clap::Command) -> anyhow::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command).render(&mut page)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))
}

fn completions(dir: &Path) -> anyhow::Result<()> {
    use clap_complete::Shell;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut command = crate::help::command();
        clap_complete::generate_to(shell, &mut command, "allocscope", dir)
            .with_context(|| format!("writing the {shell} completions"))?;
    }
    Ok(())
}
