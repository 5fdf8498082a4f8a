//! Strings from targets made safe to show.
//!
//! Process names, symbols, paths and cgroups come from the processes we profile, and a
//! process chooses its own name (`prctl(PR_SET_NAME)`) and can map files with any name.
//! Printed raw, an escape sequence in one could clear the user's screen, set the terminal's
//! title or hide text; a bidirectional override could make a name read as another. Every
//! such string goes through [`printable`] before a terminal (summary, report, `top`, logs)
//! or a viewer (SVG titles, folded lines) sees it.

use std::{borrow::Cow, fmt::Write as _};

/// Whether `c` must not reach a terminal as is: control characters (C0, DEL, C1) and the
/// invisible characters that reorder or hide text.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every unsafe character written as an escape (`\x1b`, `\u{202e}`); borrowed
/// when nothing needed escaping.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !is_unsafe(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// Processes for a line of text: "pid 12", "pids 12, 13 and 14", or, past a handful,
/// "pids 12, 13, 14, 15, 16 and 995 more" (`top --follow` once printed 1000 on one line).
pub fn pid_list(pids: &[u32]) -> String {
    const SHOWN: usize = 5;
    let listed: Vec<String> = pids.iter().take(SHOWN).map(u32::to_string).collect();
    match pids.len() {
        0 => "no process".to_owned(),
        1 => format!("pid {}", listed[0]),
        n if n <= SHOWN => format!("pids {} and {}", listed[..n - 1].join(", "), listed[n - 1]),
        n => format!("pids {} and {} more", listed.join(", "), n - SHOWN),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn pid_lists_stay_short() {
        assert_eq!(pid_list(&[]), "no process");
        assert_eq!(pid_list(&[7]), "pid 7");
        assert_eq!(pid_list(&[7, 8, 9]), "pids 7, 8 and 9");
        let many: Vec<u32> = (1..=1000).collect();
        assert_eq!(pid_list(&many), "pids 1, 2, 3, 4, 5 and 995 more");
    }

    #[test]
    fn escapes_what_a_terminal_would_act_on() {
        assert_eq!(printable("malloc"), "malloc");
        assert!(matches!(printable("ünïcode ← ok"), Cow::Borrowed(_)));
        assert_eq!(
            printable("\x1b[2J\x1b]0;pwned\x07"),
            "\\x1b[2J\\x1b]0;pwned\\x07"
        );
        assert_eq!(printable("a\nb\tc\u{9b}"), "a\\x0ab\\x09c\\x9b");
        assert_eq!(printable("abc\u{202e}fed"), "abc\\u{202e}fed");
    }

    proptest! {
        #[test]
        fn nothing_unsafe_survives(text in any::<String>()) {
            let shown = printable(&text);
            prop_assert!(!shown.chars().any(is_unsafe));
            if !text.chars().any(is_unsafe) {
                prop_assert_eq!(shown.as_ref(), text.as_str());
            }
        }
    }
}
