//! The printed summary of a recording of many processes (#44): by command within a line
//! budget, each process with `--verbose`, and groups that add up to their processes; and
//! its rows named by their site, past the allocator's wrappers (#41).

use tests::{fixture, record::Record};

/// The lines between the summary's header and its `lost events:` line: the processes'.
fn process_section(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .skip_while(|l| !l.starts_with("allocscope: ") || !l.contains(" s recorded"))
        .skip(1)
        .take_while(|l| !l.starts_with("  lost events:"))
        .collect()
}

#[test]
fn five_hundred_processes_are_summarized_by_command_within_25_lines() {
    tests::require_bpf!();
    let workload = fixture("workload", &[]);
    // 490 quick `true`s and 10 workloads: the workloads allocated nearly everything.
    let script = format!(
        "for i in $(seq 490); do /bin/true; done; for i in $(seq 10); do {} 20; done",
        workload.display()
    );
    let recorded = Record::command("sh", &["-c", &script]).run();
    let profile = &recorded.profile;
    assert!(
        profile.processes.len() >= 495,
        "{} processes",
        profile.processes.len()
    );
    let section = process_section(&recorded.stderr);
    assert!(
        section.len() <= 25,
        "{} lines:\n{}",
        section.len(),
        section.join("\n")
    );
    assert!(
        section[0].contains(&format!("{} processes of", profile.processes.len())),
        "{section:#?}"
    );
    assert!(section[1].starts_with("  workload ×10: "), "{section:#?}");
    assert!(section[2].starts_with("    largest: pid "), "{section:#?}");
    assert!(
        section.iter().any(|l| l.starts_with("  true ×4")),
        "{section:#?}"
    );
    // The stacks below still name the workload's sites.
    assert!(
        recorded.stderr.contains("site_") && recorded.stderr.contains("one_round"),
        "{}",
        recorded.stderr
    );
    // The tables take a command's processes' alike stacks together: the stack that
    // allocated most is one row for the workloads that share it, with all their samples.
    let top = &profile.command_stacks[0];
    assert_eq!(top.command, "workload", "{:#?}", profile.command_stacks);
    let workloads: Vec<u32> = profile
        .processes
        .iter()
        .filter(|p| p.command == "workload")
        .map(|p| p.pid)
        .collect();
    let members: Vec<_> = profile
        .stacks
        .iter()
        .filter(|s| s.frames == profile.stacks[top.stack].frames && workloads.contains(&s.pid))
        .collect();
    assert!(top.processes >= 2, "{top:#?}");
    assert_eq!(top.processes, members.len() as u64);
    assert_eq!(top.samples, members.iter().map(|s| s.samples).sum::<u64>());
    let first_row = recorded
        .stderr
        .lines()
        .skip_while(|l| !l.starts_with("top stacks by estimated allocated bytes:"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        first_row.contains(&format!(
            "{} samples  workload ×{}  ",
            top.samples, top.processes
        )),
        "{first_row}\n{}",
        recorded.stderr
    );
    // Each group adds up to its processes: counts exactly, the estimate as the sum of
    // theirs (one estimator over their samples together), every process in one group.
    let mut grouped = 0;
    for group in &profile.commands {
        let members: Vec<_> = profile
            .processes
            .iter()
            .filter(|p| p.command == group.command)
            .collect();
        grouped += members.len();
        assert_eq!(group.processes, members.len() as u64, "{}", group.command);
        assert_eq!(
            group.exact.calls,
            members.iter().map(|p| p.exact.calls).sum::<u64>()
        );
        assert_eq!(
            group.samples,
            members.iter().map(|p| p.samples).sum::<u64>()
        );
        let sum: f64 = members.iter().map(|p| p.alloc_bytes.estimate).sum();
        assert!(
            (group.alloc_bytes.estimate - sum).abs() <= 1e-6 * sum.max(1.0),
            "{}: {} for {sum}",
            group.command,
            group.alloc_bytes.estimate
        );
        let upper: f64 = members.iter().map(|p| p.alloc_bytes.upper).sum();
        assert!(group.alloc_bytes.upper <= upper, "{}", group.command);
    }
    assert_eq!(grouped, profile.processes.len());
}

#[test]
fn verbose_lists_every_process() {
    tests::require_bpf!();
    let recorded = Record::command("sh", &["-c", "for i in $(seq 20); do /bin/true; done"])
        .flags(&["-v"])
        .run();
    let trues = recorded
        .stderr
        .lines()
        .filter(|l| l.starts_with("  pid ") && l.contains(" (true): "))
        .count();
    let recorded_trues = recorded
        .profile
        .processes
        .iter()
        .filter(|p| p.command == "true")
        .count();
    assert!(recorded_trues >= 19, "{recorded_trues} of 20 seen");
    assert_eq!(trues, recorded_trues, "{}", recorded.stderr);
}

#[test]
fn quick_children_of_a_shell_are_unwound_against_their_own_maps() {
    tests::require_bpf!();
    let workload = fixture("workload", &[]);
    let script = format!("for i in $(seq 150); do {} 1; done", workload.display());
    let recorded = Record::command("sh", &["-c", &script]).run();
    let stacks: Vec<_> = recorded
        .profile
        .stacks
        .iter()
        .filter(|s| {
            recorded
                .profile
                .processes
                .iter()
                .any(|p| p.pid == s.pid && p.command == "workload")
        })
        .collect();
    let samples: u64 = stacks.iter().map(|s| s.samples).sum();
    let whole: u64 = stacks
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|f| f.function.as_deref() == Some("main"))
        })
        .map(|s| s.samples)
        .sum();
    // Before, the copy of the shell's maps a child inherited at its fork was taken as newer
    // than the child's own (its library's, read first): 35-55% of these samples ended at
    // "[unknown 0x7f…]". Then 0-4 of ~75 per run did (10 runs, d99d902 and cf8d263 alike):
    // the intake thread's read of a child's maps that its exit overtook (short, without the
    // libraries) was taken as newer than its library's copy. Offered as a stand-in since:
    // 0 of 65-88 in 6 runs. What is left: a sample of a forked shell before its exec, with
    // maps read only after the exec (rare).
    assert!(samples >= 20, "{samples} samples");
    assert!(
        whole as f64 >= 0.90 * samples as f64,
        "{whole} of {samples} samples reach main:\n{}",
        recorded.stderr
    );
}

#[test]
fn a_shell_loops_pipelines_are_counted_in_process_throughout() {
    tests::require_bpf!();
    // Each pipeline's processes exit while allocscope reads the others': a maps read that an
    // exit overtook ended short, without the library (mapped above the C library), and the
    // process was taken for one probed through its C library alone: "in-process, then
    // uprobes", and the C library probed for every process from then on. Before the fix, 3
    // of 6 such recordings had one or two (of ~600 processes); after, none of 17.
    let script = r#"for i in $(seq 150); do echo a b | sed s/a/c/ | sort | awk '{print $1}' >/dev/null; done"#;
    let recorded = Record::command("sh", &["-c", script]).run();
    let profile = &recorded.profile;
    assert!(
        profile.processes.len() >= 600,
        "{}",
        profile.processes.len()
    );
    let other: Vec<_> = profile
        .processes
        .iter()
        .filter(|p| {
            p.front_end != "in-process" || p.coverage.as_ref().is_some_and(|c| !c.late.is_empty())
        })
        .map(|p| (p.pid, &p.command, &p.front_end, &p.coverage))
        .collect();
    assert!(other.is_empty(), "{other:#?}");
}

/// The rows of the summary's table under `heading`: their chains (after `pid N  `).
fn table<'a>(stderr: &'a str, heading: &str) -> Vec<&'a str> {
    stderr
        .lines()
        .skip_while(|l| !l.starts_with(heading))
        .skip(1)
        .take_while(|l| l.contains("  pid "))
        .filter_map(|l| l.split_once("  pid ")?.1.split_once("  ").map(|(_, c)| c))
        .collect()
}

/// Stacks are named by their site: past a redis-like wrapper (`zmalloc`), and with
/// `--wrapper`, past the program's own pool too; the allocating frame kept beside it.
#[test]
fn rows_are_named_by_their_site_past_the_allocators_wrappers() {
    tests::require_bpf!();
    let rows = |flags: &[&str]| {
        let recorded = Record::command(fixture("wrapped", &[]), &["300"])
            .flags(&["-i", "16KiB"])
            .flags(flags)
            .run();
        let rows: Vec<String> = table(&recorded.stderr, "top stacks by estimated allocated bytes:")
            .into_iter()
            .map(str::to_owned)
            .collect();
        assert_eq!(rows.len(), 3, "{}", recorded.stderr);
        rows
    };
    let has = |rows: &[String], row: &str| rows.iter().any(|r| r.starts_with(row));
    let plain = rows(&[]);
    for row in [
        "push_list ← main ← ",
        "create_string ← main ← ",
        "pool_alloc ← parse_header ← main ← ",
    ] {
        assert!(has(&plain, row), "no row {row:?} in {plain:#?}");
    }
    assert!(
        plain.iter().all(|r| r.ends_with("[via zmalloc]")),
        "{plain:#?}"
    );
    let wrapped = rows(&["--wrapper", "^pool_alloc$"]);
    assert!(
        wrapped
            .iter()
            .any(|r| r.starts_with("parse_header ← main ← ") && r.ends_with("[via zmalloc ← …]")),
        "{wrapped:#?}"
    );
    // A pattern that does not compile: refused before anything runs.
    let out = std::process::Command::new(tests::allocscope())
        .args([
            "record",
            "--wrapper",
            "(",
            "-o",
            "/tmp/never.json",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("--wrapper"), "{said}");
}
