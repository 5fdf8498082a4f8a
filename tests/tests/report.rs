//! The HTML report and the speedscope export, in the programs that open them: the report
//! of a real recording in headless chromium (frames drawn with the widths the estimates
//! give, search, hover, zoom, value switching, the table, the charts), a differential report
//! coloured only where a change is significant, and the speedscope file against the schema
//! speedscope ships and in speedscope's own page. Screenshots go to
//! `target/screenshots/`.

use std::{collections::HashMap, path::Path, process::Command};

use serde_json::Value;
use tests::{allocscope, browser, fixture, read_profile, workspace, TempDir};

/// Records the workload fixture for `seconds` (its rounds forever) with a 100 ms tick, so
/// the report has charts over time.
fn record(out: &Path, seconds: &str, program: &[&str]) {
    succeed(
        Command::new(allocscope())
            .args(["record", "--interval", "64KiB", "--tick", "100ms"])
            .args(["--duration", seconds, "-o"])
            .arg(out)
            .arg("--")
            .args(program),
    );
}

fn report(input: &Path, output: &Path, extra: &[&str]) {
    succeed(
        Command::new(allocscope())
            .arg("report")
            .arg(input)
            .args(extra)
            .arg("-o")
            .arg(output),
    );
}

/// Runs `command`, which must succeed (its stderr shown if not).
fn succeed(command: &mut Command) {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn screenshot(url: &str, name: &str, height: u32) {
    let dir = workspace().join("target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join(name);
    browser::screenshot(url, (1400, height), &png);
    eprintln!("screenshot: {}", png.display());
}

/// What the flame graph must draw for `metric`: each frame (depth, name) and its share of
/// the total, from the profile's stacks (root first: the process, then the frames).
fn expected_shares(profile: &Value, metric: &str) -> HashMap<(usize, String), f64> {
    let mut sums: HashMap<(usize, String), f64> = HashMap::new();
    let mut total = 0.0;
    let command: HashMap<u64, String> = profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pid"].as_u64().unwrap(),
                p["command"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for stack in profile["stacks"].as_array().unwrap() {
        let value = stack[metric]["estimate"].as_f64().unwrap_or(0.0).max(0.0);
        total += value;
        let pid = stack["pid"].as_u64().unwrap();
        let mut path = vec![format!("{} ({pid})", command[&pid])];
        for frame in stack["frames"].as_array().unwrap().iter().rev() {
            path.push(frame["function"].as_str().unwrap_or("?").to_owned());
        }
        // Frames of one stack are distinct tree nodes even where names repeat by depth.
        for (depth, name) in path.into_iter().enumerate() {
            *sums.entry((depth + 1, name)).or_default() += value;
        }
    }
    sums.into_iter().map(|(k, v)| (k, v / total)).collect()
}

/// The driver: what a user does, and what the page showed each time.
const DRIVER: &str = include_str!("../js/report_driver.js");

/// What `frees_all` holds at its highest: 1000 blocks of 4 KiB.
const FREES_ALL_PEAK: f64 = 1000.0 * 4096.0;

#[test]
fn a_command_that_frees_all_it_held_opens_on_its_peak_and_an_empty_value_is_said() {
    tests::require_bpf!();
    let dir = TempDir::new("report-peak");
    // 20 fillings of the same heap: the peak is the highest of 20 noisy levels.
    let recorded = tests::Record::command(fixture("frees_all", &[]), &["20"])
        .flags(&["--interval", "16KiB", "--confidence", "0.999"])
        .run();
    let profile = &recorded.profile;
    assert!(profile
        .stacks
        .iter()
        .all(|s| s.inuse_bytes.is_some_and(|e| e.estimate == 0.0)));
    // The peak: the process's and its one site's, holding the truth; nothing else then.
    let process = &profile.processes[0];
    let peak = process.peak.expect("a peak");
    let why = &recorded.stderr;
    tests::record::assert_holds(&peak.inuse_bytes, FREES_ALL_PEAK, "the peak", why);
    assert!((15.0..=25.0).contains(&peak.fillings), "{peak:?}");
    let site = profile
        .stacks
        .iter()
        .find(|s| tests::record::frame_is(s, 0, "site"))
        .expect("the site's stack");
    tests::record::assert_holds(&site.peak_bytes.unwrap(), FREES_ALL_PEAK, "the site", why);
    assert!(
        why.contains("peak live heap") && why.contains("live bytes at the peak"),
        "{why}"
    );
    // By default every picture opens on the peak, and nothing is said to be empty.
    let folded = dir.path("default.folded");
    let out = Command::new(allocscope())
        .arg("report")
        .arg(&recorded.file)
        .arg("-o")
        .arg(&folded)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !said.contains("is 0 for every stack"),
        "{said}"
    );
    let lines = std::fs::read_to_string(&folded).unwrap();
    let total: f64 = lines
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(total.round(), peak.inuse_bytes.estimate.round(), "{lines}");
    let pprof = dir.path("default.pb.gz");
    report(&recorded.file, &pprof, &[]);
    let top = Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(&pprof)
        .output()
        .expect("go tool pprof");
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.contains("Type: peak_space") && top.contains("site"),
        "{top}"
    );
    // Asked for live bytes: the empty picture is said, with the value that has data.
    for format in ["svg", "folded", "html"] {
        let output = dir.path(&format!("inuse.{format}"));
        let out = Command::new(allocscope())
            .arg("report")
            .arg(&recorded.file)
            .args(["--value", "inuse-bytes", "-o"])
            .arg(&output)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{said}");
        assert!(
            said.contains("(inuse-bytes) is 0 for every stack")
                && said.contains("--value peak-bytes"),
            "{format}: {said}"
        );
    }
}

#[test]
fn an_alloc_only_recording_opens_on_allocated_bytes() {
    tests::require_bpf!();
    let dir = TempDir::new("report-alloc-only");
    let recorded = tests::Record::command(fixture("frees_all", &[]), &["20"])
        .flags(&["--alloc-only"])
        .run();
    assert!(recorded.profile.processes[0].peak.is_none());
    let svg = dir.path("default.svg");
    report(&recorded.file, &svg, &[]);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains("estimated bytes allocated") && svg.contains("site"),
        "{svg}"
    );
}

#[test]
fn the_html_report_of_a_real_recording_works_in_a_browser() {
    tests::require_bpf!();
    let dir = TempDir::new("report-html");
    let json = dir.path("workload.json");
    let workload = fixture("workload", &[]);
    record(
        &json,
        "2s",
        &[workload.to_str().unwrap(), "100", "--forever"],
    );
    let html = dir.path("workload.html");
    report(&json, &html, &["--value", "alloc-bytes"]);
    let profile = read_profile(&json);
    let seen = browser::drive(&html, DRIVER, &dir.path("."));
    assert_eq!(seen["ready"], "1", "{seen}");
    eprintln!("report interactive after {} ms", seen["readyMs"]);
    let metrics: Vec<&str> = seen["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(
        metrics[..4],
        [
            "allocated bytes",
            "allocations",
            "live bytes",
            "live allocations"
        ]
    );
    // Every frame at least a pixel wide is drawn, as wide as its share of the total.
    let width = seen["width"].as_f64().unwrap();
    let check = |drawn: &Value, metric: &str| {
        let expected = expected_shares(&profile, metric);
        let min = seen["minWidth"].as_f64().unwrap();
        let wide_enough: Vec<_> = expected
            .iter()
            .filter(|(_, share)| *share * width >= min)
            .collect();
        let drawn = drawn.as_array().unwrap();
        // Drawn: the root ("all", depth 0) and the frames.
        assert_eq!(drawn.len(), wide_enough.len() + 1, "{metric}: {drawn:#?}");
        for frame in &drawn[1..] {
            let key = (
                frame["depth"].as_u64().unwrap() as usize,
                frame["name"].as_str().unwrap().to_owned(),
            );
            let share = expected[&key];
            let w = frame["w"].as_f64().unwrap();
            assert!(
                (w - share * width).abs() < 0.01 * width.max(1.0) / 100.0 + 0.05,
                "{metric}: {key:?} drawn {w} px, expected {}",
                share * width
            );
        }
    };
    check(&seen["initial"], "alloc_bytes");
    check(&seen["objects"], "alloc_objects");
    // Search highlights exactly the frames it matches, and says their share.
    let mut searched: Vec<&str> = seen["searched"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    searched.sort();
    assert_eq!(searched, ["site_calloc", "site_small"]);
    assert!(
        seen["matched"].as_str().unwrap().starts_with("matched: "),
        "{seen}"
    );
    // A frame of one stack shows that stack's own estimate and bounds.
    let site = profile["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["frames"][0]["function"] == "site_small")
        .unwrap();
    let drawn = seen["initial"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "site_small")
        .unwrap();
    for (ours, theirs) in [
        ("estimate", "estimate"),
        ("lower", "lower"),
        ("upper", "upper"),
    ] {
        let a = drawn[ours].as_f64().unwrap();
        let b = site["alloc_bytes"][theirs].as_f64().unwrap();
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "{ours}: {a} vs {b}"
        );
    }
    let tooltip = seen["tooltip"]["text"].as_str().unwrap();
    assert_eq!(seen["tooltip"]["hidden"], false);
    assert!(
        tooltip.contains("site_small")
            && tooltip.contains("allocated bytes: ")
            && tooltip.contains(" at 95%")
            && tooltip.contains("samples"),
        "{tooltip}"
    );
    assert!(
        tooltip.contains('[') && tooltip.contains(']'),
        "bounds: {tooltip}"
    );
    // Zoomed on one_round: it spans the graph, its ancestors too (dimmed), its sites below.
    let zoomed = seen["zoomed"].as_array().unwrap();
    let one_round = zoomed.iter().find(|f| f["name"] == "one_round").unwrap();
    assert!((one_round["w"].as_f64().unwrap() - width).abs() < 0.01);
    assert!(zoomed.iter().filter(|f| f["ancestor"] == true).count() >= 3);
    let site_small_zoomed = zoomed.iter().find(|f| f["name"] == "site_small").unwrap();
    assert!(site_small_zoomed["w"].as_f64() >= drawn["w"].as_f64());
    // Charts: live bytes and allocation rate (the process and its top stacks, each with its
    // band), and the size histogram.
    let charts = seen["charts"].as_array().unwrap();
    assert_eq!(charts.len(), 3, "{charts:?}");
    for chart in &charts[..2] {
        assert!(chart["lines"].as_u64().unwrap() >= 2, "{chart}");
        assert_eq!(chart["lines"], chart["bands"]);
    }
    assert!(charts[2]["bars"].as_u64().unwrap() >= 5, "{}", charts[2]);
    // The table: every stack, sorted by samples on request, a row opening its whole stack.
    assert_eq!(
        seen["rows"].as_u64().unwrap() as usize,
        profile["stacks"].as_array().unwrap().len()
    );
    let sorted: Vec<u64> = seen["sortedSamples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(sorted.windows(2).all(|w| w[0] >= w[1]), "{sorted:?}");
    let detail = seen["detail"].as_array().expect("an opened row");
    let process = format!("workload ({})", profile["processes"][0]["pid"]);
    assert_eq!(detail.last().unwrap().as_str(), Some(process.as_str()));
    assert!(detail.iter().any(|f| f == "one_round"), "{detail:?}");
    screenshot(
        &format!("file://{}", html.display()),
        "report-workload.png",
        1300,
    );
}

/// A differential report: each frame coloured by the significance of its change (the
/// sites: their stacks' change as `diff` computed it), grey where it is within the noise;
/// against another program, the workload's sites are significant shrinkage and the other
/// program's frames growth.
#[test]
fn a_differential_report_colours_only_significant_changes() {
    tests::require_bpf!();
    let dir = TempDir::new("report-diff");
    let workload = fixture("workload", &[]);
    let (a, b) = (dir.path("a.json"), dir.path("b.json"));
    record(&a, "1s", &[workload.to_str().unwrap(), "100", "--forever"]);
    record(&b, "1s", &[workload.to_str().unwrap(), "100", "--forever"]);
    let diff = |base: &Path, new: &Path, name: &str| {
        let (html, json) = (
            dir.path(&format!("{name}.html")),
            dir.path(&format!("{name}.json")),
        );
        succeed(
            Command::new(allocscope())
                .arg("diff")
                .args([base, new])
                .arg("-o")
                .arg(&html)
                .arg("-o")
                .arg(&json),
        );
        (html, read_profile(&json))
    };
    let driver = include_str!("../js/diff_driver.js");
    let (html, found) = diff(&a, &b, "same");
    let seen = browser::drive(&html, driver, &dir.path("."));
    assert_eq!(seen["title"], "Differential flame graph");
    let frames = seen["frames"].as_array().unwrap();
    for stack in found["stacks"].as_array().unwrap() {
        let leaf = stack["key"][1].as_str().unwrap();
        if !leaf.starts_with("site_") {
            continue;
        }
        let change = &stack["alloc_change"];
        let expected = match (
            change["significant"].as_bool().unwrap(),
            change["estimate"].as_f64().unwrap() > 0.0,
        ) {
            (false, _) => "0",
            (true, true) => "1",
            (true, false) => "-1",
        };
        let frame = frames
            .iter()
            .find(|f| f["name"] == leaf)
            .unwrap_or_else(|| panic!("{leaf}: {seen}"));
        assert_eq!(frame["sig"], expected, "{leaf}: {change}");
        assert_eq!(frame["unchanged"], expected == "0", "{frame}");
    }
    assert!(seen["rows"].as_u64().unwrap() >= 7);
    // Against a recording of another program, long enough (~0.1 s) that the rates it
    // rules out for the stacks it lacks are well below the workload's: `paths 10 20` ran
    // 0.2–12 ms, and a stack absent from 0.2 ms could still run at GB/s (1 run in ~10
    // drew every site grey).
    let other = dir.path("other.json");
    let paths = fixture("paths", &[]);
    record(&other, "1s", &[paths.to_str().unwrap(), "10", "1000"]);
    let (html, _) = diff(&a, &other, "other");
    let seen = browser::drive(&html, driver, &dir.path("."));
    let frames = seen["frames"].as_array().unwrap();
    let sig = |name: &str| {
        frames
            .iter()
            .find(|f| f["name"] == name)
            .map(|f| f["sig"].as_str().unwrap().to_owned())
    };
    assert_eq!(sig("site_periodic_big").as_deref(), Some("-1"), "{seen}");
    assert!(
        frames.iter().any(|f| f["sig"] == "1"),
        "no growth drawn: {seen}"
    );
    screenshot(
        &format!("file://{}", html.display()),
        "report-diff.png",
        900,
    );
}

#[test]
fn the_speedscope_file_follows_speedscopes_schema_and_opens_in_speedscope() {
    tests::require_bpf!();
    let tools = browser::js_tools();
    let dir = TempDir::new("report-speedscope");
    let json = dir.path("workload.json");
    let workload = fixture("workload", &[]);
    record(
        &json,
        "1s",
        &[workload.to_str().unwrap(), "100", "--forever"],
    );
    let file = dir.path("workload.speedscope.json");
    report(&json, &file, &[]);
    let validate = |path: &Path| {
        Command::new("node")
            .arg(workspace().join("tests/js/validate_speedscope.js"))
            .arg(&tools)
            .arg(path)
            .output()
            .expect("node (Debian nodejs; cargo xtask setup installs it)")
    };
    let out = validate(&file);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}");
    // Six values (frees tracked: allocated, live at the end and at the peak, each in bytes
    // and allocations), one frame table.
    assert!(said.starts_with("valid 6 "), "{said}");
    // The validator does refuse what the schema forbids.
    let mut broken: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    broken["profiles"][0]["weights"][0] = Value::String("many".into());
    let bad = dir.path("broken.speedscope.json");
    std::fs::write(&bad, serde_json::to_vec(&broken).unwrap()).unwrap();
    assert!(!validate(&bad).status.success(), "a broken file passed");
    // speedscope's own page imports it (over HTTP: it `fetch`es `#profileURL=`), and shows
    // the profile it was told to open first in its toolbar, the others in its menu.
    let site = dir.path("site");
    let release = tools.join("node_modules/speedscope/dist/release");
    std::fs::create_dir_all(&site).unwrap();
    for entry in std::fs::read_dir(&release).unwrap().flatten() {
        std::fs::copy(entry.path(), site.join(entry.file_name())).unwrap();
    }
    std::fs::copy(&file, site.join("profile.speedscope.json")).unwrap();
    let base = browser::serve(&site);
    let url = format!("{base}/index.html#profileURL={base}/profile.speedscope.json");
    let dom = browser::dump_dom(&url, (1400, 900), 4000);
    assert!(
        dom.contains("estimated bytes in use at the peak (allocscope)")
            && dom.contains("estimated bytes allocated (allocscope)"),
        "speedscope did not show the profile: {}",
        &dom[dom.len().saturating_sub(2000)..]
    );
    screenshot(&url, "speedscope-workload.png", 700);
}

/// A stack thousands of frames deep is drawn whole in a differential report: the flame
/// graph was drawn by recursion, and a diff of stacks 4096 frames deep threw "Maximum call
/// stack size exceeded" (#39.14). The recorder cuts its own stacks at 256 frames, so the
/// deep one is written into a recorded profile.
#[test]
fn a_differential_report_draws_stacks_thousands_of_frames_deep() {
    tests::require_bpf!();
    let dir = TempDir::new("report-deep");
    let workload = fixture("workload", &[]);
    let base = dir.path("base.json");
    record(
        &base,
        "1s",
        &[workload.to_str().unwrap(), "100", "--forever"],
    );
    let mut deep = read_profile(&base);
    let stack = &mut deep["stacks"][0];
    let template = stack["frames"][0].clone();
    let frames: Vec<Value> = (0..5000)
        .map(|level| {
            let mut frame = template.clone();
            frame["function"] = Value::from(format!("level_{level}"));
            frame
        })
        .collect();
    stack["frames"] = Value::from(frames);
    let new = dir.path("deep.json");
    std::fs::write(&new, serde_json::to_vec(&deep).unwrap()).unwrap();
    let html = dir.path("deep.html");
    succeed(
        Command::new(allocscope())
            .arg("diff")
            .args([&base, &new])
            .arg("-o")
            .arg(&html),
    );
    let seen = browser::drive(&html, include_str!("../js/diff_driver.js"), &dir.path("."));
    let levels = seen["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"].as_str().is_some_and(|n| n.starts_with("level_")))
        .count();
    assert!(levels >= 4096, "{levels} of 5000 levels drawn");
}
