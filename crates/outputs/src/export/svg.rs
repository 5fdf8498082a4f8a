//! SVG flame graph (inferno as a library): interactive in a browser (hover, click to zoom,
//! search), titled with the targets, the sampling interval, the duration and what the widths
//! mean.

use std::io::Write;

use inferno::flamegraph::{self, Options};

use super::{folded, Value};
use crate::{format, schema::Profile, text};

/// Writes `profile` as an SVG flame graph of `value`.
pub(crate) fn write(profile: &Profile, value: Value, out: &mut dyn Write) -> std::io::Result<()> {
    let targets: Vec<String> = profile
        .processes
        .iter()
        .map(|p| format!("{} ({})", text::printable(&p.command), p.pid))
        .collect();
    let mut options = Options::default();
    options.title = format!("allocscope: {}", targets.join(", "));
    options.subtitle = Some(format!(
        "width = {} · mean sampling interval {} · {:.1} s recorded · bounds in the JSON export",
        value.describe(),
        format::bytes(profile.sampling.mean_interval_bytes as f64),
        profile.duration_seconds,
    ));
    options.count_name = if value.is_bytes() {
        "bytes"
    } else {
        "allocations"
    }
    .to_owned();
    options.name_type = "Function:".to_owned();
    options.colors = flamegraph::Palette::Basic(flamegraph::color::BasicPalette::Mem);
    let folded = folded::lines(profile, value);
    // inferno adds the values up in a usize: values whose sum would overflow it (only a
    // profile edited by hand has them) are drawn to scale, divided by a common factor.
    let total: u128 = folded.iter().map(|(_, amount)| u128::from(*amount)).sum();
    let divisor = total.div_ceil(u128::from(u64::MAX)).max(1) as u64;
    if divisor > 1 {
        if let Some(subtitle) = options.subtitle.as_mut() {
            subtitle.push_str(&format!(" · values divided by {divisor}"));
        }
    }
    let lines: Vec<String> = folded
        .into_iter()
        .map(|(path, amount)| (path, amount / divisor))
        .filter(|(_, amount)| *amount > 0)
        .map(|(path, amount)| format!("{path} {amount}"))
        .collect();
    if lines.is_empty() {
        // inferno refuses an empty graph; say so in a valid SVG instead.
        return writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="600" height="60"><text x="10" y="30">{}: no samples ({})</text></svg>"#,
            xml_escape(&options.title),
            value.describe()
        );
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
        .map_err(std::io::Error::other)
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_whose_sum_overflows_are_drawn_to_scale() {
        let mut profile = allocscope_model::fixtures::synthetic();
        for stack in &mut profile.stacks {
            stack.alloc_bytes.estimate = 1.5e19;
        }
        let mut out = Vec::new();
        write(&profile, Value::AllocBytes, &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert!(svg.contains("values divided by"), "{svg}");
    }
}
