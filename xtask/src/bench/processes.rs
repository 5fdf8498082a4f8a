//! The many-processes benchmark (`cargo xtask bench --processes`, #44): what `record --
//! CMD` costs a command that is not one long process but many short ones, against the
//! command natively and under heaptrack, in the same rounds.
//!
//! Workloads: `true` (allocscope's fixed cost: loading and attaching, then the end's
//! work); a shell loop of 300 `echo | sed | sort | awk` pipelines (~1,500 processes: the
//! cost per short process); and `make -j2` of Lua 5.4.7's 32 C files (the sources the
//! `lua-src` crate bundles, fetched once from crates.io and checked against their SHA-256:
//! gcc, cc1, as, ld, ar — a real build). Per round each workload runs natively, under
//! allocscope and under heaptrack, in an order rotated every round; wall times, their
//! medians, and the median of the per-round ratios. allocscope's peak RSS is read from
//! `wait4` (the largest of it and the processes it waited for: tiny for the first two).

use std::time::Instant;

#[allow(clippy::wildcard_imports)]
use super::*;

const LUA_CRATE: &str = "lua-src-547.0.0";
const LUA_SHA256: &str = "1edaf29e3517b49b8b746701e5648ccb5785cde1c119062cbabbc5d5cd115e42";
const SHELL_LOOP: &str = "for i in $(seq 300); do echo hello world | sed s/o/0/g | sort | awk '{print $1}' >/dev/null; done\n";
/// Lua's library and interpreter from the bundled sources, one object per file.
const LUA_MAKEFILE: &str = "CFLAGS = -O2 -Wall -DLUA_COMPAT_5_3 -DLUA_USE_LINUX
CORE = $(filter-out lua.o,$(patsubst %.c,%.o,$(wildcard *.c)))
all: liblua.a lua
%.o: %.c
\t$(CC) $(CFLAGS) -c $< -o $@
liblua.a: $(CORE)
\t$(AR) rcs $@ $^
lua: lua.o liblua.a
\t$(CC) -o $@ lua.o liblua.a -lm -ldl
clean:
\trm -f *.o liblua.a lua
";
/// The interpreter's main, which the crate leaves out (it builds a library): a minimal one.
const LUA_MAIN: &str = "#include \"lua.h\"\n#include \"lauxlib.h\"\n#include \"lualib.h\"\n\
int main(int argc, char **argv) { lua_State *L = luaL_newstate(); luaL_openlibs(L);\n\
int failed = argc > 1 && luaL_dofile(L, argv[1]); lua_close(L); return failed; }\n";

/// A run: wall seconds, and the peak RSS in KiB `wait4` gave.
type Run = (f64, u64);

/// The benchmark: `rounds` rounds (after a warm-up) of each workload in each mode.
pub(super) fn processes(args: &BenchArgs, allocscope: &Path, out_dir: &Path) -> anyhow::Result<()> {
    let lua = lua_sources(out_dir)?;
    let script = out_dir.join("many.sh");
    std::fs::write(&script, SHELL_LOOP)?;
    let make = vec![
        "make".to_owned(),
        "-s".to_owned(),
        "-j2".to_owned(),
        "-C".to_owned(),
        lua.display().to_string(),
    ];
    let workloads: Vec<(&str, Vec<String>)> = vec![
        ("true", vec!["/bin/true".to_owned()]),
        (
            "shell loop (~1,500 processes)",
            vec!["sh".to_owned(), script.display().to_string()],
        ),
        ("make -j2 (Lua 5.4.7, 32 files)", make),
    ];
    // Each workload writes files of its own: replacing the previous workload's (a shell
    // loop's recording of megabytes) was 10 ms of `true`'s time.
    let record = |w: usize| out_dir.join(format!("processes-{w}.json"));
    let heaptrack = |w: usize| out_dir.join(format!("processes-{w}.heaptrack"));
    let modes: [(&str, Vec<String>); 3] = [
        ("native", Vec::new()),
        (
            "allocscope",
            vec![
                allocscope.display().to_string(),
                "record".into(),
                "-o".into(),
                RECORD_PATH.into(),
                "--".into(),
            ],
        ),
        (
            "heaptrack",
            vec!["heaptrack".into(), "-o".into(), HEAPTRACK_PATH.into()],
        ),
    ];
    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); modes.len()]; workloads.len()];
    eprintln!("round  workload                          mode        seconds  peak RSS");
    for round in 0..=args.rounds.min(5) {
        for (w, (name, command)) in workloads.iter().enumerate() {
            for m in (0..modes.len()).map(|i| (i + round) % modes.len()) {
                if w == 2 {
                    status(
                        Command::new("make")
                            .args(["-s", "-C"])
                            .arg(&lua)
                            .arg("clean")
                            .stdout(Stdio::null()),
                    )?;
                }
                let mut argv = own_files(&modes[m].1, &record(w), &heaptrack(w));
                argv.extend(command.iter().cloned());
                let run = timed(&argv)?;
                eprintln!(
                    "{:>5}  {name:<33} {:<10} {:>8.3}  {:>6} MiB",
                    if round == 0 {
                        "warm".into()
                    } else {
                        round.to_string()
                    },
                    modes[m].0,
                    run.0,
                    run.1 / 1024
                );
                if round > 0 {
                    runs[w][m].push(run);
                }
            }
        }
    }
    report(&workloads, &modes, &runs);
    Ok(())
}

/// Stand-ins for each workload's own output files in the modes' command lines.
const RECORD_PATH: &str = "{record}";
const HEAPTRACK_PATH: &str = "{heaptrack}";

/// A mode's command line with the workload's own files in place of the stand-ins.
fn own_files(prefix: &[String], record: &Path, heaptrack: &Path) -> Vec<String> {
    prefix
        .iter()
        .map(|arg| match arg.as_str() {
            RECORD_PATH => record.display().to_string(),
            HEAPTRACK_PATH => heaptrack.display().to_string(),
            _ => arg.clone(),
        })
        .collect()
}

/// Runs `argv` with its output dropped: its wall time and peak RSS.
fn timed(argv: &[String]) -> anyhow::Result<Run> {
    let started = Instant::now();
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", argv[0]))?;
    let (code, rss) = wait4(child.id())?;
    let seconds = started.elapsed().as_secs_f64();
    if code != 0 {
        bail!("{argv:?} exited with status {code}");
    }
    Ok((seconds, rss))
}

/// Waits for `pid`: its exit status and the peak RSS (KiB) of it and what it waited for.
fn wait4(pid: u32) -> anyhow::Result<(i32, u64)> {
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child with pointers to our locals.
    let waited = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
    if waited < 0 {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Ok((code, usage.ru_maxrss as u64))
}

/// Lua's sources with a Makefile, under `out_dir` (fetched and checked once).
fn lua_sources(out_dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = out_dir.join(LUA_CRATE).join("lua-5.4.7");
    if dir.join("Makefile").exists() {
        return Ok(dir);
    }
    let archive = out_dir.join(format!("{LUA_CRATE}.crate"));
    let url = format!("https://static.crates.io/crates/lua-src/{LUA_CRATE}.crate");
    status(
        Command::new("curl")
            .args(["-sSfL", "-o"])
            .arg(&archive)
            .arg(&url),
    )?;
    let sum = crate::run::output(Command::new("sha256sum").arg(&archive)).unwrap_or_default();
    if !sum.starts_with(LUA_SHA256) {
        bail!("{url}: SHA-256 {sum} is not the pinned {LUA_SHA256}");
    }
    status(
        Command::new("tar")
            .args(["xzf"])
            .arg(&archive)
            .arg("-C")
            .arg(out_dir),
    )?;
    std::fs::write(dir.join("lua.c"), LUA_MAIN)?;
    std::fs::write(dir.join("Makefile"), LUA_MAKEFILE)?;
    Ok(dir)
}

/// Medians per workload and mode, and the median per-round ratio to native.
fn report(
    workloads: &[(&str, Vec<String>)],
    modes: &[(&str, Vec<String>); 3],
    runs: &[Vec<Vec<Run>>],
) {
    println!("\nmedians over {} rounds (wall seconds; ratio: median of the per-round ratios to native, [min, max]):", runs[0][0].len());
    for (w, (name, _)) in workloads.iter().enumerate() {
        let native: Vec<f64> = runs[w][0].iter().map(|r| r.0).collect();
        let mut line = format!("  {name:<33} native {:.3} s", median(native.clone()));
        for (m, (mode, _)) in modes.iter().enumerate().skip(1) {
            let ratios: Vec<f64> = runs[w][m]
                .iter()
                .zip(&native)
                .map(|(r, n)| r.0 / n)
                .collect();
            let (low, high) = (
                ratios.iter().copied().fold(f64::INFINITY, f64::min),
                ratios.iter().copied().fold(0.0, f64::max),
            );
            let seconds = median(runs[w][m].iter().map(|r| r.0).collect());
            line += &format!(
                "; {mode} {seconds:.3} s, {:.2}× [{low:.2}, {high:.2}]",
                median(ratios)
            );
        }
        let rss = median(runs[w][1].iter().map(|r| r.1 as f64).collect());
        let added_ms = (median(runs[w][1].iter().map(|r| r.0).collect()) - median(native)) * 1e3;
        println!(
            "{line}; allocscope +{added_ms:.0} ms, peak RSS {:.0} MiB",
            rss / 1024.0
        );
    }
    println!("targets (#44): true ≤ native + 20 ms; the shell loop ≤ 1.3× and below heaptrack; the build ≤ 1.10×");
}
