//! A real browser for the HTML report's tests: Debian's chromium, headless, and the npm
//! tools the speedscope export is checked with (`cargo xtask setup` installs both).
//!
//! A page is driven by a script appended to a copy of it: it runs after the report's own
//! script, acts as a user would (events on the DOM: search, hover, click, choose), and
//! writes what it saw as JSON into `<pre id="test-results">`, which `--dump-dom` prints.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// Where `cargo xtask setup` installs speedscope and ajv (kept across clean clones).
pub fn js_tools() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let dir = PathBuf::from(home).join(".cache/allocscope-js-tools");
    assert!(
        dir.join("node_modules/speedscope/package.json").exists()
            && dir.join("node_modules/ajv/package.json").exists(),
        "speedscope and ajv missing under {} (cargo xtask setup installs them)",
        dir.display()
    );
    dir
}

/// chromium, headless, killed after two minutes (a page that never settles must not hang
/// the tests).
fn chromium() -> Command {
    let mut command = Command::new("timeout");
    command.args(["120", "chromium"]);
    command.args([
        "--headless=new",
        "--no-sandbox",
        "--enable-unsafe-swiftshader",
        "--no-first-run",
        "--disable-extensions",
        "--hide-scrollbars",
        "--allow-file-access-from-files",
    ]);
    command
}

/// The DOM of `url` after its scripts ran (`budget_ms` of virtual time), `window` wide.
pub fn dump_dom(url: &str, window: (u32, u32), budget_ms: u32) -> String {
    let output = chromium()
        .arg(format!("--window-size={},{}", window.0, window.1))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("chromium (Debian's chromium; cargo xtask setup installs it)");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `driver` (JavaScript) in a copy of the page `html` and returns the JSON it wrote
/// into `#test-results`.
pub fn drive(html: &Path, driver: &str, dir: &Path) -> serde_json::Value {
    let page = std::fs::read_to_string(html).unwrap();
    let script = format!("<script>\n{driver}\n</script>\n</body>");
    let driven = page.replacen("</body>", &script, 1);
    let copy = dir.join(format!(
        "driven-{}",
        html.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&copy, driven).unwrap();
    let dom = dump_dom(&format!("file://{}", copy.display()), (1400, 1000), 5000);
    let start = dom
        .rfind("<pre id=\"test-results\">")
        .unwrap_or_else(|| panic!("no test results in the page's DOM:\n{}", tail(&dom)));
    let body = &dom[start..];
    let json = &body[body.find('>').unwrap() + 1..body.find("</pre>").unwrap()];
    let json = json
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

fn tail(text: &str) -> &str {
    &text[text.len().saturating_sub(3000)..]
}

/// Serves the files under `root` over HTTP on 127.0.0.1 (a page that `fetch`es, as
/// speedscope does its `#profileURL=`, cannot read `file://`), for as long as the test runs.
/// Returns the base URL.
pub fn serve(root: &Path) -> String {
    use std::io::{BufRead as _, BufReader, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let root = root.to_owned();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let mut reader = BufReader::new(&stream);
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // Headers are read up to the blank line, then ignored.
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let path = path.split(['?', '#']).next().unwrap_or("/");
            let file = root.join(path.trim_start_matches('/'));
            let body = (!path.contains(".."))
                .then(|| std::fs::read(&file).ok())
                .flatten();
            let mut stream = &stream;
            let _ = match body {
                Some(body) => {
                    let kind = match file.extension().and_then(|e| e.to_str()) {
                        Some("html") => "text/html",
                        Some("js") => "text/javascript",
                        Some("css") => "text/css",
                        Some("json") => "application/json",
                        Some("wasm") => "application/wasm",
                        _ => "application/octet-stream",
                    };
                    write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n",
                        body.len()
                    )
                    .and_then(|()| stream.write_all(&body))
                }
                None => write!(
                    stream,
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                ),
            };
        }
    });
    base
}

/// Takes a screenshot of `url`, `window` large, into `png`.
pub fn screenshot(url: &str, window: (u32, u32), png: &Path) {
    let output = chromium()
        .arg(format!("--window-size={},{}", window.0, window.1))
        .arg("--virtual-time-budget=3000")
        .arg(format!("--screenshot={}", png.display()))
        .arg(url)
        .output()
        .expect("chromium");
    assert!(
        output.status.success() && png.exists(),
        "screenshot failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
