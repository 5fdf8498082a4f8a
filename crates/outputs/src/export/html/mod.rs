//! The HTML report: one self-contained file (no server, no network) with an interactive
//! flame graph, a sortable table of stacks and functions, the timeline's charts and the
//! size histogram, under the summary's header.
//!
//! Why this split: what a number means is decided here, in Rust, where it is tested; the
//! page's script only adds estimates up and draws. Each stack carries, per value, its
//! estimate and one standard error below and one above it, read back from its bounds as
//! `allocscope diff` reads them ([`Spread`]); a flame-graph node or a function sums its
//! stacks and adds the errors in quadrature (stacks are sampled independently), so a node
//! of one stack shows exactly that stack's bounds, and a sum's bounds are those of
//! [`Spread::add`] (`data::node_bounds` is the script's rule, tested here and in the browser).
//!
//! The script and style are compact vanilla JS and CSS written for this report
//! ([`TEMPLATE`], `report.js`, `report.css`): no library to vendor, and the page stays
//! interactive with 10,000 stacks because only frames at least a pixel wide are drawn and
//! the table shows its top rows. Everything a target named (frames, commands) reaches the
//! page as JSON text and is set with `textContent`, never parsed as HTML.

mod data;
mod diff;

use std::io::Write;

pub(crate) use data::{profile_data, Data};
pub use diff::diff_data;

use super::Value;
use crate::schema::Profile;
#[cfg(doc)]
use crate::stats::difference::Spread;

/// The page: `{{TITLE}}`, `{{STYLE}}`, `{{DATA}}` and `{{SCRIPT}}` are filled in.
pub(crate) const TEMPLATE: &str = include_str!("report.html");
const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");

/// Writes `profile` as an HTML report opening on `value`.
pub(crate) fn write(profile: &Profile, value: Value, out: &mut dyn Write) -> std::io::Result<()> {
    page(&profile_data(profile, value), out)
}

/// Writes the page for `data`.
pub fn page(data: &Data, out: &mut dyn Write) -> std::io::Result<()> {
    let json = serde_json::to_string(data)?;
    // Inside <script>, `</script` ends the element early and `<!--` followed by `<script`
    // makes the parser skip the real end (the page went blank): no `<` may appear. It only
    // occurs inside JSON strings, where `\u003c` is the same character.
    let json = json.replace('<', "\\u003c");
    let title = html_escape(&data.title);
    out.write_all(
        fill(
            TEMPLATE,
            &[
                ("{{TITLE}}", &title),
                ("{{STYLE}}", STYLE),
                ("{{DATA}}", &json),
                ("{{SCRIPT}}", SCRIPT),
            ],
        )
        .as_bytes(),
    )
}

/// `template` with each marker replaced by its text, in one pass: a text (a title naming a
/// target's command) is never searched for markers itself.
fn fill(template: &str, markers: &[(&str, &str)]) -> String {
    let mut out =
        String::with_capacity(template.len() + markers.iter().map(|m| m.1.len()).sum::<usize>());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        match markers.iter().find(|(marker, _)| after.starts_with(marker)) {
            Some((marker, text)) => {
                out.push_str(text);
                rest = &after[marker.len()..];
            }
            None => {
                out.push_str("{{");
                rest = &after[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_whole_and_its_data_cannot_end_the_script() {
        let mut profile = allocscope_model::fixtures::synthetic();
        profile.processes[0].command = "<!--<script></script><b>x{{DATA}}".into();
        let mut out = Vec::new();
        write(&profile, Value::AllocBytes, &mut out).unwrap();
        let html = String::from_utf8(out).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        for marker in ["{{TITLE}}", "{{STYLE}}", "{{SCRIPT}}"] {
            assert!(!html.contains(marker), "{marker} left");
        }
        assert_eq!(html.matches("</script>").count(), 2, "data and script only");
        for fetch in [
            "src=\"http",
            "href=\"http",
            "url(http",
            "fetch(",
            "XMLHttpRequest",
        ] {
            assert!(!html.contains(fetch), "the page would fetch: {fetch}");
        }
        let start = html
            .find(r#"<script type="application/json" id="data">"#)
            .unwrap();
        let body = &html[start..];
        let json = &body[body.find('>').unwrap() + 1..body.find("</script>").unwrap()];
        let data: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(data["kind"], "profile");
        assert!(data["title"]
            .as_str()
            .unwrap()
            .contains("<!--<script></script><b>x{{DATA}}"));
        assert!(html
            .contains("<title>allocscope: &lt;!--&lt;script&gt;&lt;/script&gt;&lt;b&gt;x{{DATA}}"));
        assert!(!json.contains('<'), "no `<` in the data: {json}");
    }
}
