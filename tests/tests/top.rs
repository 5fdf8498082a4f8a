//! `allocscope top` in a real terminal: tmux runs it on a paced workload of known call sites,
//! `send-keys` drives it, `capture-pane` shows what a user would see.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use tests::{allocscope, first_byte, wait_until, Fixture, TempDir, INT3};

/// A private tmux server (its own socket), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts `command` (run by sh) in a detached session of `width`×`height`.
    fn start(name: &str, command: &str, width: u16, height: u16) -> Tmux {
        let tmux = Tmux {
            socket: format!("allocscope-{name}-{}", std::process::id()),
        };
        let ok = tmux
            .command()
            .args(["new-session", "-d", "-s", "top"])
            .args(["-x", &width.to_string(), "-y", &height.to_string()])
            .arg(command)
            .status()
            .expect("running tmux (cargo xtask setup installs it)")
            .success();
        assert!(ok, "tmux new-session failed");
        tmux
    }

    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command.args(["-L", &self.socket]);
        command
    }

    /// Sends keys (tmux key names: `Enter`, `Escape`, `q`, or literal text).
    fn send(&self, keys: &[&str]) {
        let ok = self
            .command()
            .args(["send-keys", "-t", "top"])
            .args(keys)
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux send-keys {keys:?} failed");
    }

    /// The screen's text now.
    fn screen(&self) -> String {
        let out = self
            .command()
            .args(["capture-pane", "-p", "-t", "top"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen satisfies `predicate`; panics with the screen otherwise.
    fn wait_for(&self, what: &str, timeout: Duration, predicate: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if predicate(&screen) {
                return screen;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; the screen shows:\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command().arg("kill-server").status();
    }
}

/// `12.3M/s` → bytes per second.
fn parse_rate(cell: &str) -> f64 {
    let number = cell.trim_end_matches("/s");
    let (digits, unit) = number.split_at(number.len() - 1);
    let scale = match unit {
        "B" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        _ => panic!("unexpected unit in {cell:?}"),
    };
    digits.parse::<f64>().unwrap() * scale
}

/// The first cell (the sort column's value) of the row whose label contains `site`.
fn first_cell<'a>(screen: &'a str, site: &str) -> &'a str {
    screen
        .lines()
        .find(|line| line.contains(&format!("{site} ←")))
        .and_then(|line| line.split_whitespace().next())
        .unwrap_or_else(|| panic!("no row for {site}:\n{screen}"))
}

fn start_fixture() -> (Fixture, u64) {
    let mut fixture = Fixture::start("top", &[], &[]);
    let line = fixture.line();
    let address = line
        .strip_prefix("malloc 0x")
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .unwrap_or_else(|| panic!("fixture said {line:?}"));
    (fixture, address)
}

/// The shell command tmux runs: `allocscope top` on `target` (`-p PID` or `-- CMD`), its
/// stderr and exit status saved in `dir`, the recording written to `dir/top.json` at the
/// end (`-o` as for record; snapshots beside it).
/// (`-p` with uprobes: these tests watch their breakpoints come and go; loading into a
/// running process is attach.rs's.)
fn top_command(target: &str, dir: &TempDir) -> String {
    format!(
        "{} top --front-end uprobes -i 64KiB --leaks-older-than 2s -o {} {target} 2>{}; echo $? >{}; sleep 600",
        allocscope().display(),
        dir.path("top.json").display(),
        dir.path("stderr").display(),
        dir.path("exit").display(),
    )
}

/// The target's pid in the view's header (`… · pid N (name) · …`).
fn header_pid(screen: &str) -> u32 {
    screen
        .split("pid ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in the header:\n{screen}"))
}

/// The time the view has run, from its header (`… · 1:05 · …`).
fn elapsed_seconds(screen: &str) -> Option<u32> {
    let header = screen.lines().next()?;
    header.split(" · ").find_map(|field| {
        let (minutes, seconds) = field.trim().split_once(':')?;
        Some(minutes.parse::<u32>().ok()? * 60 + seconds.parse::<u32>().ok()?)
    })
}

fn exit_status(dir: &TempDir) -> Option<String> {
    std::fs::read_to_string(dir.path("exit"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[test]
fn top_shows_known_sites_and_obeys_keys_in_a_real_terminal() {
    tests::require_bpf!();
    let (mut fixture, malloc) = start_fixture();
    let pid = fixture.pid();
    let dir = TempDir::new("top-keys");
    let tmux = Tmux::start("keys", &top_command(&format!("-p {pid}"), &dir), 80, 24);

    // The header names the target; after the window fills, both churn sites have rates.
    let screen = tmux.wait_for("both churn sites", Duration::from_secs(20), |s| {
        s.contains("churn_buffers ←") && s.contains("churn_strings ←") && s.contains("0:06")
    });
    assert!(screen.contains(&format!("pid {pid} (top)")), "{screen}");
    assert_eq!(
        first_byte(pid, malloc),
        INT3,
        "malloc is probed while top runs"
    );
    // Default sort: the window's rate, so churn_buffers (25.6x churn_strings) comes first.
    let buffers = screen.find("churn_buffers ←").unwrap();
    let strings = screen.find("churn_strings ←").unwrap();
    assert!(buffers < strings, "rate order:\n{screen}");
    let ratio = parse_rate(first_cell(&screen, "churn_buffers"))
        / parse_rate(first_cell(&screen, "churn_strings"));
    assert!(
        (17.0..=38.0).contains(&ratio),
        "churn_buffers/churn_strings rate ratio {ratio}, expected 25.6:\n{screen}"
    );
    assert!(screen.contains("RATE 10s▼"), "{screen}");

    // s: the next column sorts.
    tmux.send(&["s"]);
    tmux.wait_for("sort by RATE all", Duration::from_secs(5), |s| {
        s.contains("RATE all▼")
    });

    // /: filter by function; only matching groups stay.
    tmux.send(&["/"]);
    tmux.send(&["-l", "strings"]);
    tmux.send(&["Enter"]);
    let screen = tmux.wait_for("the filter", Duration::from_secs(5), |s| {
        s.contains("filter /strings/") && !s.contains("churn_buffers ←")
    });
    assert!(screen.contains("churn_strings ←"), "{screen}");

    // Enter: the full stack of the selected group, with source lines.
    tmux.send(&["Enter"]);
    let screen = tmux.wait_for("the expanded stack", Duration::from_secs(5), |s| {
        s.contains("│ main") || s.contains("└ main")
    });
    assert!(screen.contains("top.c:"), "{screen}");
    tmux.send(&["Escape"]);
    tmux.wait_for("the filter cleared", Duration::from_secs(5), |s| {
        s.contains("churn_buffers ←")
    });

    // l: the leak view lists what stays live longer than 2 s: grow_cache, not the churn.
    tmux.send(&["l"]);
    let screen = tmux.wait_for("the leak view", Duration::from_secs(10), |s| {
        s.contains("LEAKS") && s.contains("grow_cache ←")
    });
    assert!(!screen.contains("churn_buffers ←"), "{screen}");
    assert!(!screen.contains("churn_strings ←"), "{screen}");
    tmux.send(&["l"]);

    // r: the growth view puts grow_cache, which keeps every block, first, marked growing.
    tmux.send(&["r"]);
    let screen = tmux.wait_for("the growth view", Duration::from_secs(10), |s| {
        s.contains("GROWTH▼") && s.contains("▲")
    });
    let first_row = screen
        .lines()
        .find(|l| l.contains("▸ ") || l.contains("▾ "))
        .unwrap_or_default();
    assert!(
        first_row.contains("grow_cache ←") && first_row.contains("▲"),
        "{screen}"
    );
    // t: the churn frees its blocks at once: temporary; grow_cache's never are.
    tmux.send(&["t"]);
    let screen = tmux.wait_for("the temporary view", Duration::from_secs(10), |s| {
        s.contains("TEMPORARY") && s.contains("churn_buffers ←")
    });
    assert!(!screen.contains("grow_cache ←"), "{screen}");
    tmux.send(&["t"]);

    // w: a snapshot file, named in the status line, that `report` reads.
    tmux.send(&["w"]);
    let screen = tmux.wait_for("the snapshot", Duration::from_secs(10), |s| {
        s.contains("wrote ")
    });
    let written: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("allocscope-") && n.ends_with(".json"))
        .collect();
    assert_eq!(written.len(), 1, "{written:?}\n{screen}");
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path(&written[0])).unwrap()).unwrap();
    let text = profile.to_string();
    assert!(text.contains("grow_cache") && text.contains("churn_buffers"));
    // The same profile record writes: its probe points and thread states too.
    assert!(
        profile["probes"].as_array().is_some_and(|p| !p.is_empty()),
        "{text}"
    );
    assert!(profile["thread_states"].as_u64().is_some(), "{text}");

    // q: the terminal is restored, every probe detached, the target keeps running.
    tmux.send(&["q"]);
    assert!(
        wait_until(Duration::from_secs(10), || exit_status(&dir).is_some()),
        "top did not exit after q:\n{}",
        tmux.screen()
    );
    assert_eq!(exit_status(&dir).as_deref(), Some("0"));
    let screen = tmux.screen();
    assert!(
        !screen.contains("RATE 10s"),
        "alternate screen left:\n{screen}"
    );
    let stderr = std::fs::read_to_string(dir.path("stderr")).unwrap();
    assert!(
        stderr.contains(&format!("detached from pid {pid}")),
        "{stderr}"
    );
    // `-o FILE`: the whole recording written when the view ended, as record writes it.
    let written = tests::read_profile(&dir.path("top.json"));
    let text = written.to_string();
    assert!(
        text.contains("grow_cache") && text.contains("churn_buffers"),
        "{stderr}"
    );
    assert!(stderr.contains("wrote "), "{stderr}");
    assert_ne!(first_byte(pid, malloc), INT3, "malloc still probed after q");
    // Still allocating, unprobed: it prints progress again.
    let before = fixture.line();
    let after = fixture.line();
    assert_ne!(before, after);
    assert!(
        fixture.child.try_wait().unwrap().is_none(),
        "the target died"
    );
}

#[test]
fn top_survives_sigterm_and_target_exit() {
    tests::require_bpf!();
    // A target that exits: its last picture stays, marked exited; q still leaves cleanly.
    let (mut fixture, _) = start_fixture();
    let pid = fixture.pid();
    let dir = TempDir::new("top-exit");
    let tmux = Tmux::start("exit", &top_command(&format!("-p {pid}"), &dir), 100, 30);
    tmux.wait_for("a first row", Duration::from_secs(20), |s| {
        s.contains("churn_buffers ←")
    });
    fixture.child.kill().unwrap();
    fixture.child.wait().unwrap();
    let screen = tmux.wait_for("EXITED", Duration::from_secs(10), |s| s.contains("EXITED"));
    assert!(screen.contains(&format!("{pid} (top) exited")), "{screen}");
    assert!(
        screen.contains("churn_buffers ←"),
        "the last picture stays:\n{screen}"
    );
    tmux.send(&["q"]);
    assert!(wait_until(Duration::from_secs(10), || exit_status(&dir).is_some()));
    assert_eq!(exit_status(&dir).as_deref(), Some("0"));

    // SIGTERM: the terminal is restored and every probe detached.
    let (fixture, malloc) = start_fixture();
    let pid = fixture.pid();
    let dir = TempDir::new("top-term");
    let tmux = Tmux::start("term", &top_command(&format!("-p {pid}"), &dir), 80, 24);
    tmux.wait_for("a first row", Duration::from_secs(20), |s| {
        s.contains("churn_buffers ←")
    });
    assert_eq!(first_byte(pid, malloc), INT3);
    let killed = Command::new("pkill")
        .args(["-TERM", "-f"])
        .arg(format!("^{} top .* -p {pid}$", allocscope().display()))
        .status()
        .unwrap();
    assert!(killed.success(), "no allocscope top process to signal");
    assert!(
        wait_until(Duration::from_secs(10), || exit_status(&dir).is_some()),
        "top did not exit on SIGTERM:\n{}",
        tmux.screen()
    );
    assert_eq!(exit_status(&dir).as_deref(), Some("0"));
    assert!(!tmux.screen().contains("RATE 10s"), "alternate screen left");
    assert_ne!(
        first_byte(pid, malloc),
        INT3,
        "malloc still probed after SIGTERM"
    );
    drop(fixture);
}

#[test]
fn top_runs_a_command_without_letting_it_touch_the_screen() {
    tests::require_bpf!();
    let program = tests::fixture("top", &[]);
    let dir = TempDir::new("top-command");
    let command = top_command(&format!("-- {}", program.display()), &dir);
    let tmux = Tmux::start("command", &command, 80, 24);
    let screen = tmux.wait_for("the command's sites", Duration::from_secs(20), |s| {
        s.contains("churn_buffers ←") && s.contains("0:02")
    });
    // Its output went to the log, not over the view.
    assert!(!screen.contains("progress"), "{screen}");
    let log = dir.path("allocscope-command.log");
    assert!(
        wait_until(Duration::from_secs(5), || std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("progress 1"))),
        "no output in {}",
        log.display()
    );
    let pid = header_pid(&screen);
    tmux.send(&["q"]);
    assert!(wait_until(Duration::from_secs(10), || exit_status(&dir).is_some()));
    assert_eq!(exit_status(&dir).as_deref(), Some("0"));
    // The command was started for the view: it stops with it.
    assert!(
        wait_until(Duration::from_secs(5), || !std::path::Path::new(&format!(
            "/proc/{pid}/exe"
        ))
        .exists()),
        "the command (pid {pid}) still runs after q"
    );
}

#[test]
fn top_rows_are_by_command_above_eight_processes() {
    tests::require_bpf!();
    // Ten copies of the fixture under one shell: each site is one row over the ten, named
    // by their command and how many processes it sums (a build's cc1 ×33 so).
    let program = tests::fixture("top", &[]);
    let dir = TempDir::new("top-grouped");
    let script = format!(
        "-- sh -c 'for i in 1 2 3 4 5 6 7 8 9 10; do {} >/dev/null & done; wait'",
        program.display()
    );
    let command = top_command(&script, &dir);
    let tmux = Tmux::start("grouped", &command, 140, 30);
    let screen = tmux.wait_for(
        "one row per site for the ten",
        Duration::from_secs(30),
        |s| {
            s.contains("11 processes")
                && s.lines()
                    .any(|l| l.contains("churn_buffers ←") && l.ends_with("[top ×10]"))
        },
    );
    // One row for the ten copies' site (a row of one process is still right where a site
    // is one process's alone: a stdio buffer's first allocation).
    let rows: Vec<&str> = screen
        .lines()
        .filter(|l| l.contains("churn_buffers ←"))
        .collect();
    assert_eq!(rows.len(), 1, "{screen}");
    assert!(rows[0].ends_with("[top ×10]"), "{screen}");
    tmux.send(&["q"]);
    assert!(wait_until(Duration::from_secs(10), || exit_status(&dir).is_some()));
}

/// The terminal goes away (a killed tmux, a dropped ssh session): `top` ends, detached, and
/// the command it started ends with it. (It spun on a core, attached, for as long as
/// anyone let it: crossterm's reader retries end-of-file forever.)
#[test]
fn top_ends_with_its_terminal() {
    tests::require_bpf!();
    let program = tests::fixture("top", &[]);
    let dir = TempDir::new("top-hangup");
    // `-o`: the command's output log goes there, not into the working directory.
    let command = format!(
        "{} top -o {} -- {} 2>{}",
        allocscope().display(),
        dir.0.display(),
        program.display(),
        dir.path("stderr").display()
    );
    let tmux = Tmux::start("hangup", &command, 80, 24);
    let screen = tmux.wait_for("the command's sites", Duration::from_secs(20), |s| {
        s.contains("churn_buffers ←")
    });
    let pid = header_pid(&screen);
    // allocscope started the command: it is its parent.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let parent: u32 = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|ppid| ppid.parse().ok())
        .unwrap_or_else(|| panic!("no parent in {stat:?}"));
    let comm = std::fs::read_to_string(format!("/proc/{parent}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "allocscope", "pid {pid}'s parent {parent}");
    drop(tmux);
    // Gone, or a zombie nobody reaped yet (its parent gone too: init reaps it).
    let gone = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit(')')
                    .next()?
                    .split_whitespace()
                    .next()?
                    .chars()
                    .next()
            })
            .is_none_or(|state| state == 'Z' || state == 'X')
    };
    assert!(
        wait_until(Duration::from_secs(5), || gone(parent)),
        "allocscope (pid {parent}) still runs after its terminal went away:\n{}",
        std::fs::read_to_string(dir.path("stderr")).unwrap_or_default()
    );
    assert!(
        wait_until(Duration::from_secs(5), || gone(pid)),
        "the command (pid {pid}) still runs after allocscope ended"
    );
}

/// A Go program in the view: its sites through its runtime's own sampler, led by the
/// program's functions; its calls are not ours to count, but its runtime's own totals are
/// read at each refresh, and the header's exact rate is theirs (not `n/a`), within a few
/// percent of the sampled rate beside it.
#[test]
fn top_shows_a_go_program_through_its_runtime() {
    tests::require_bpf!();
    let program = tests::go_fixture("goalloc");
    let mut fixture = Fixture::start_binary(
        &program,
        &[
            "-rate",
            "524288",
            "-rounds",
            "400000000",
            "-leak-every",
            "0",
            "-wait",
        ],
        &[],
    );
    fixture.expect("ready");
    let dir = TempDir::new("top-go");
    let command = top_command(&format!("-p {}", fixture.pid()), &dir);
    let tmux = Tmux::start("go", &command, 120, 24);
    tmux.wait_for("the view", Duration::from_secs(20), |s| s.contains("pid "));
    fixture.go();
    tmux.wait_for("the Go sites", Duration::from_secs(20), |s| {
        s.contains("main.record ← main.main") && s.contains("main.churn ← main.main")
    });
    // (The rows above are led by the program's functions: the runtime's allocation frames
    // are left out; the runtime's own allocations, a GC worker's, keep theirs.)
    let screen = tmux.wait_for("4 s of rates", Duration::from_secs(20), |s| {
        elapsed_seconds(s).is_some_and(|seconds| seconds >= 4)
    });
    let header = screen
        .lines()
        .find(|l| l.starts_with("rate "))
        .unwrap_or_else(|| panic!("no rate line:\n{screen}"));
    let after = |label: &str| {
        let rest = header.split(label).nth(1).unwrap_or("");
        rest.split_whitespace().next().unwrap_or("").to_owned()
    };
    let (exact, sampled) = (after("exact "), after("sampled "));
    assert_ne!(exact, "n/a", "{screen}");
    let ratio = parse_rate(&exact) / parse_rate(&sampled);
    assert!(
        (0.9..=1.1).contains(&ratio),
        "exact {exact} against sampled {sampled}:\n{screen}"
    );
    tmux.send(&["q"]);
    assert!(wait_until(Duration::from_secs(10), || exit_status(&dir).is_some()));
    assert_eq!(exit_status(&dir).as_deref(), Some("0"));
}
