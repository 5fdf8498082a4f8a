//! Human renderings shared by every output (summary, report, top, folded lines, SVG and
//! pprof names): byte units, percentages, and the name a frame goes by.

use crate::{schema::FrameInfo, text};

/// Formats a byte count with a binary unit (`1.5 MiB`).
pub fn bytes(value: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = value.max(0.0);
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A signed byte count (`+1.5 MiB`, `-512 B`, `+∞`): changes and slopes.
pub fn signed_bytes(value: f64) -> String {
    if value.is_infinite() {
        if value < 0.0 { "-∞" } else { "+∞" }.to_owned()
    } else if value < 0.0 {
        format!("-{}", bytes(-value))
    } else {
        format!("+{}", bytes(value))
    }
}

/// A confidence level as a percentage without trailing zeros (`95%`, `99.99%`).
pub fn percent(level: f64) -> String {
    let text = format!("{:.4}", level * 100.0);
    format!("{}%", text.trim_end_matches('0').trim_end_matches('.'))
}

/// A frame's display name: the function, else `module+0xoffset`, else the address; a
/// Python frame's with its file's name and line (`main (app.py:9)`).
pub fn frame_name(frame: &FrameInfo) -> String {
    if frame.kind == Some(crate::schema::FrameKind::Python) {
        let function = frame.function.as_deref().unwrap_or("?");
        let file = frame.file.as_deref().unwrap_or("");
        let file = file.rsplit('/').next().unwrap_or(file);
        let name = match frame.line {
            Some(line) => format!("{function} ({file}:{line})"),
            None if !file.is_empty() => format!("{function} ({file})"),
            None => function.to_owned(),
        };
        return sanitize(&name);
    }
    function_name(frame)
}

/// A frame's function name alone (for formats that carry the file and line apart, such as
/// pprof): the function, else `module+0xoffset`, else the address.
pub fn function_name(frame: &FrameInfo) -> String {
    let name = match (&frame.function, &frame.module) {
        (Some(function), _) => function.to_string(),
        (None, Some(module)) => {
            let name = module.rsplit('/').next().unwrap_or(module);
            format!("{name}+{:#x}", frame.address)
        }
        (None, None) => format!("[unknown {:#x}]", frame.address),
    };
    sanitize(&name)
}

/// `;` separates frames and a trailing space-separated number is the value: keep names
/// from breaking either (line breaks are escaped with every other control character).
pub fn sanitize(name: &str) -> String {
    text::printable(name).replace(';', ":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fall_back_to_module_offsets() {
        let named = FrameInfo {
            function: Some("a;b".into()),
            ..FrameInfo::default()
        };
        assert_eq!(frame_name(&named), "a:b");
        let offset = FrameInfo {
            module: Some("/usr/lib/libx.so".into()),
            address: 0x10,
            ..FrameInfo::default()
        };
        assert_eq!(frame_name(&offset), "libx.so+0x10");
        assert_eq!(frame_name(&FrameInfo::default()), "[unknown 0x0]");
    }

    #[test]
    fn byte_units() {
        assert_eq!(bytes(0.0), "0 B");
        assert_eq!(bytes(1023.0), "1023 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
        assert_eq!(bytes(f64::NAN), "0 B");
        assert_eq!(percent(0.95), "95%");
        assert_eq!(percent(0.9999), "99.99%");
    }
}
