//! `-h` short, `--help` whole. Every flag's doc comment says everything about it (what man
//! pages and `--help` show); `-h` is what a person reads at a prompt: one screen (at most
//! [`SHORT_LINES`] lines of at most [`WIDTH`] columns), the flags one reaches for first,
//! each in its first sentence, and where the rest is. Shaped here, from the one definition
//! in [`crate::cli`], rather than written twice.

use clap::{Arg, Command, CommandFactory as _};

use crate::cli::Cli;

/// Columns help is wrapped to (fewer on a narrower terminal).
pub const WIDTH: usize = 100;

/// Lines `-h` takes at most, for any command.
pub const SHORT_LINES: usize = 25;

/// The flags `-h` shows, per command (by argument id); a command not listed shows all.
const FIRST_REACHED: &[(&str, &[&str])] = &[
    (
        "record",
        &[
            "pids",
            "command",
            "comm",
            "all",
            "interval",
            "alloc_only",
            "duration",
            "output",
            "leaks_older_than",
        ],
    ),
    (
        "top",
        &[
            "pids",
            "command",
            "comm",
            "interval",
            "alloc_only",
            "leaks_older_than",
            "window",
        ],
    ),
    (
        "agent",
        &[
            "all",
            "comm",
            "period",
            "pyroscope",
            "otlp_http",
            "otlp_grpc",
            "out_dir",
        ],
    ),
];

/// The command line as parsed and as documented (man pages, completions): `-h` short.
pub fn command() -> Command {
    shape(Cli::command())
}

fn shape(command: Command) -> Command {
    command.max_term_width(WIDTH).mut_subcommands(|sub| {
        let name = sub.get_name().to_owned();
        let shown = FIRST_REACHED
            .iter()
            .find(|(command, _)| *command == name)
            .map(|(_, ids)| *ids);
        let examples = sub.get_after_help().cloned();
        let mut sub = sub.max_term_width(WIDTH).mut_args(|arg| {
            let keep = shown.is_none_or(|ids| ids.contains(&arg.get_id().as_str()));
            shorten(arg, keep)
        });
        if let Some(examples) = examples {
            sub = sub.after_long_help(examples).after_help(format!(
                "Every option with its default, and examples: allocscope {name} --help"
            ));
        }
        sub
    })
}

/// `arg` with its first sentence as its `-h` help (hidden from `-h` unless `shown`) and
/// its whole doc as its `--help`.
fn shorten(arg: Arg, shown: bool) -> Arg {
    let Some(full) = arg.get_help().map(ToString::to_string) else {
        return arg;
    };
    let arg = if arg.get_long_help().is_none() {
        arg.long_help(full.clone())
    } else {
        arg
    };
    arg.help(first_sentence(&full)).hide_short_help(!shown)
}

/// Characters of a flag's `-h` help at most.
const SHORT_HELP: usize = 60;

/// The first sentence of `text` (up to `. `, `: ` or `; `), cut at its last `, ` or ` (`
/// before [`SHORT_HELP`] characters when longer, else at a word, with `…`.
pub fn first_sentence(text: &str) -> String {
    let end = [". ", ": ", "; "]
        .iter()
        .filter_map(|stop| {
            text.match_indices(stop).map(|(at, _)| at).find(|&at| {
                !["e.g", "i.e", "etc"]
                    .iter()
                    .any(|a| text[..at].ends_with(a))
            })
        })
        .min()
        .unwrap_or(text.len());
    let sentence = text[..end].trim_end_matches('.');
    if sentence.chars().count() <= SHORT_HELP {
        return sentence.to_owned();
    }
    let limit = sentence
        .char_indices()
        .nth(SHORT_HELP)
        .map_or(sentence.len(), |(i, _)| i);
    let mut head = &sentence[..limit];
    // Not inside a parenthesis left open.
    while head.matches('(').count() > head.matches(')').count() {
        match head.rfind(" (") {
            Some(open) => head = &head[..open],
            None => break,
        }
    }
    if head.len() < limit {
        return head.to_owned();
    }
    if let Some(cut) = [", ", " ("].iter().filter_map(|s| head.rfind(s)).max() {
        if cut > SHORT_HELP / 3 {
            return head[..cut].to_owned();
        }
    }
    let cut = head.rfind(' ').unwrap_or(head.len());
    format!("{}…", &head[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_sentence_is_kept_whole_or_cut_where_it_reads() {
        assert_eq!(
            first_sentence("Mean sampling interval: on average one sample per this many bytes"),
            "Mean sampling interval"
        );
        assert_eq!(
            first_sentence("Process to profile (repeat for several)"),
            "Process to profile (repeat for several)"
        );
        assert_eq!(
            first_sentence(
                "Processes whose name (/proc/PID/comm) matches this regex, now and as they \
                 start (counted from their exec). Like --follow"
            ),
            "Processes whose name (/proc/PID/comm) matches this regex"
        );
        assert_eq!(
            first_sentence("Stop after this long (e.g. 10, 30s, 500ms, 2m); default: until Ctrl-C"),
            "Stop after this long (e.g. 10, 30s, 500ms, 2m)"
        );
        assert_eq!(
            first_sentence("Every process on the host (each allocator file probed once, for all)"),
            "Every process on the host"
        );
        let long = first_sentence(&"word ".repeat(40));
        assert!(
            long.ends_with('…') && long.chars().count() <= SHORT_HELP + 1,
            "{long}"
        );
    }

    /// Every command's `-h` fits one screen: at most 25 lines of at most 100 columns.
    #[test]
    fn every_short_help_fits_one_screen() {
        let mut command = command();
        command.build();
        for sub in command.get_subcommands_mut() {
            if sub.is_hide_set() {
                continue;
            }
            let text = sub.render_help().to_string();
            let lines: Vec<&str> = text.lines().collect();
            assert!(
                lines.len() <= SHORT_LINES,
                "{}: {} lines\n{text}",
                sub.get_name(),
                lines.len()
            );
            for line in &lines {
                assert!(
                    line.chars().count() <= WIDTH,
                    "{}: {line:?}",
                    sub.get_name()
                );
            }
        }
    }
}
