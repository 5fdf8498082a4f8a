//! `cargo xtask bench --report`: how soon an HTML report of more than 10,000 stacks is
//! interactive in a browser (target: 2 s), and how long a search and a change of value
//! take there. The recording is the paths fixture at a 64-byte interval (`paths 14 2`:
//! ~12,800 distinct stacks); the page runs in Debian's headless chromium, driven by
//! `xtask/report/driver.js`, which reads the times the page itself measured.

use std::{path::Path, process::Command};

use anyhow::{bail, Context as _};

use super::BenchArgs;
use crate::run::{fixture, status, workspace};

pub fn report(args: &BenchArgs, allocscope: &Path, out_dir: &Path) -> anyhow::Result<()> {
    let paths = fixture("paths")?;
    let json = out_dir.join("report-bench.json");
    let html = out_dir.join("report-bench.html");
    status(
        Command::new(allocscope)
            .args(["record", "-i", "64", "--max-stacks", "100000", "-o"])
            .arg(&json)
            .arg("--")
            .arg(&paths)
            .args(["14", "2"]),
    )?;
    status(
        Command::new(allocscope)
            .arg("report")
            .arg(&json)
            .args(["--top", "0", "--value", "alloc-bytes", "-o"])
            .arg(&html),
    )?;
    let page = std::fs::read_to_string(&html)?;
    let driver = std::fs::read_to_string(workspace().join("xtask/report/driver.js"))?;
    let driven = out_dir.join("report-bench-driven.html");
    std::fs::write(
        &driven,
        page.replacen("</body>", &format!("<script>{driver}</script></body>"), 1),
    )?;
    println!(
        "report of {} ({:.1} MB), {} rounds in headless chromium (window 1400x1000):",
        json.display(),
        page.len() as f64 / 1e6,
        args.rounds
    );
    println!("round  stacks  frames drawn  interactive (ms)  script (ms)  search (ms)  value switch (ms)");
    for round in 0..args.rounds {
        let output = Command::new("timeout")
            .args(["120", "chromium", "--headless=new", "--no-sandbox"])
            .args([
                "--window-size=1400,1000",
                "--virtual-time-budget=5000",
                "--dump-dom",
            ])
            .arg(format!("file://{}", driven.display()))
            .output()
            .context("chromium (cargo xtask setup installs it)")?;
        let dom = String::from_utf8_lossy(&output.stdout);
        let Some(start) = dom.rfind("<pre id=\"bench\">") else {
            bail!(
                "no measurements in the page: {}",
                &dom[dom.len().saturating_sub(500)..]
            );
        };
        let body = &dom[start..];
        let line =
            &body[body.find('>').unwrap_or(0) + 1..body.find("</pre>").unwrap_or(body.len())];
        println!("{round:>5}  {line}");
    }
    Ok(())
}
