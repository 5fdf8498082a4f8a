//! Drawing the [`App`] onto a ratatui frame: header, sparklines, the stack table, status and
//! key footer. Pure over the app state, so the tests draw on ratatui's `TestBackend`.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Modifier, Style, Stylize as _},
    text::{Line, Span},
    widgets::{Block, Cell, Clear, Paragraph, Row as TableRow, Sparkline, Table, Wrap},
    Frame,
};

use super::{
    app::App,
    model::{self, compact_bytes, compact_count, relative_bound, Column, Picture, View},
};
use crate::format;

/// Every view is named (`?` lists the rest: moving, pausing, writing a snapshot); fits 80
/// columns.
const KEYS: &str = "q quit ⏎ expand s sort / filter │ l leaks r growth t temp T threads │ ? help";

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, app: &mut App) {
    let [header, sparks, table, status, footer] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(if frame.area().height >= 20 { 3 } else { 0 }),
        Constraint::Min(3),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    draw_header(frame, header, app);
    draw_sparklines(frame, sparks, app.picture());
    draw_table(frame, table, app);
    draw_status(frame, status, app);
    frame.render_widget(
        Paragraph::new(KEYS).style(Style::new().add_modifier(Modifier::REVERSED)),
        footer,
    );
    if app.help() {
        draw_help(frame, app);
    }
}

/// The targets, by pid and name while they fit at a glance; beyond three (`--all`,
/// `--comm`, `--follow`), how many and how many still run: the table names each one's.
fn targets_label(targets: &[model::TargetState]) -> String {
    if targets.len() > 3 {
        let running = targets.iter().filter(|t| !t.exited).count();
        return format!(" · {} processes, {running} running", targets.len());
    }
    let named: Vec<String> = targets
        .iter()
        .map(|t| {
            let state = if t.exited { " exited" } else { "" };
            format!("{} ({}){state}", t.pid, t.command)
        })
        .collect();
    format!(" · pid {}", named.join(", "))
}

fn draw_header(frame: &mut Frame, area: Rect, app: &App) {
    let lines = vec![
        Line::from(header_title(app)),
        header_rates(app.picture()),
        Line::from(header_heap_and_cost(app.picture())),
    ];
    frame.render_widget(Paragraph::new(lines), area);
}

/// The header's first line: what is recorded, for how long, how, and the view's state.
fn header_title(app: &App) -> Vec<Span<'static>> {
    let picture = app.picture();
    let settings = &picture.settings;
    let mut first = vec![
        Span::from("allocscope top").bold(),
        Span::from(targets_label(&picture.targets)),
        Span::from(format!(
            " · {} · interval {} · {} bounds",
            clock(picture.elapsed_seconds),
            compact_bytes(settings.interval as f64),
            format::percent(settings.confidence)
        )),
    ];
    if picture.finished {
        first.push(Span::from("  EXITED").bold().red());
    }
    if app.paused() {
        first.push(Span::from("  PAUSED").bold().yellow());
    }
    if let Some(tag) = app.view().tag() {
        first.push(Span::from(format!("  {tag}")).bold().magenta());
    }
    first
}

/// The header's second line: exact and sampled rates, and the samples lost.
fn header_rates(picture: &Picture) -> Line<'static> {
    let totals = &picture.totals;
    let sampled = model::sampled_rate(picture);
    let window = model::seconds_label(picture.settings.window_seconds);
    let lost = if totals.lost > 0 {
        Span::from(format!("lost {}", totals.lost)).red().bold()
    } else {
        Span::from("lost 0")
    };
    let exact = if counts_calls(picture) {
        format!(
            "exact {}/s {} calls/s",
            compact_bytes(totals.bytes_per_second),
            compact_count(totals.calls_per_second)
        )
    } else {
        "exact n/a".to_owned()
    };
    Line::from(vec![
        Span::from(format!(
            "rate {window}  {exact} │ sampled {}/s {} │ {} smp/s │ ",
            compact_bytes(sampled.estimate),
            relative_bound(&sampled),
            format_rate(totals.samples_per_second),
        )),
        lost,
    ])
}

/// Whether the calls of any process shown are counted exactly: another program's sampling
/// allocator reports its samples only, and so does a Go runtime whose own totals cannot be
/// read (an executable without DWARF): the exact rate is then "n/a", not 0.
fn counts_calls(picture: &Picture) -> bool {
    let processes = &picture.tally.processes;
    processes.is_empty()
        || processes.iter().any(|p| {
            p.go_totals.is_some()
                || p.allocators
                    .iter()
                    .any(|a| !crate::probe::go::describes(a) && !a.contains(" probes ("))
        })
}

/// The header's third line: the live heap and RSS, and what the probes cost.
fn header_heap_and_cost(picture: &Picture) -> String {
    let processes = &picture.tally.processes;
    let rss: u64 = processes.iter().filter_map(|p| p.rss_bytes).sum();
    let untracked: u64 = processes.iter().map(|p| p.untracked_samples).sum();
    let live = match model::live_heap(picture) {
        Some(live) => {
            // What "live" counts from: blocks allocated since then (#64: a command top
            // started was said to be "since attach").
            let since = if picture.settings.from_start {
                "since it started"
            } else {
                "since attach"
            };
            let mut text = format!(
                "live heap {} ({since}) │ RSS {}",
                model::bytes_cell(&live),
                compact_bytes(rss as f64)
            );
            if untracked > 0 {
                text.push_str(&format!(" · {untracked} untracked"));
            }
            text
        }
        None => format!(
            "live heap not tracked (--alloc-only) · RSS {}",
            compact_bytes(rss as f64)
        ),
    };
    // Measured (see crate::cost): the targets' CPU share when their CPU time moved
    // enough to tell, else the cores the probes took.
    let cost = &picture.totals.cost;
    let spent = match cost.share {
        Some(share) if share >= 1.0 => format!("+{:.0}% CPU", share * 100.0),
        Some(share) => format!("+{:.1}% CPU", share * 100.0),
        None => format!("{:.1}% core", cost.cores * 100.0),
    };
    let per_call = if cost.ns_per_call >= 1000.0 {
        format!("{:.1}µs", cost.ns_per_call / 1000.0)
    } else {
        format!("{:.0}ns", cost.ns_per_call)
    };
    format!("{live} │ probes {spent}, {per_call}/call")
}

fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

fn format_rate(per_second: f64) -> String {
    if per_second < 10.0 {
        format!("{per_second:.1}")
    } else {
        compact_count(per_second)
    }
}

fn draw_sparklines(frame: &mut Frame, area: Rect, picture: &Picture) {
    if area.height == 0 {
        return;
    }
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let rates: Vec<u64> = picture
        .history
        .iter()
        .map(|p| p.bytes_per_second as u64)
        .collect();
    let live: Vec<u64> = picture
        .history
        .iter()
        .map(|p| p.live_bytes as u64)
        .collect();
    let spark = |title: String, data: &[u64], area: Rect, frame: &mut Frame| {
        // Newest at the right edge.
        let width = area.width.saturating_sub(1) as usize;
        let data = &data[data.len().saturating_sub(width)..];
        frame.render_widget(
            Sparkline::default()
                .block(Block::new().title(title))
                .data(data)
                .style(Style::new().cyan()),
            area,
        );
    };
    let max_rate = rates.iter().copied().max().unwrap_or(0);
    if counts_calls(picture) {
        spark(
            format!(
                "alloc B/s, last {}s (max {})",
                rates.len(),
                compact_bytes(max_rate as f64)
            ),
            &rates,
            left,
            frame,
        );
    } else {
        // The history is of exact counts, which a program's own sampler does not give (nor
        // a Go runtime whose totals cannot be read).
        let text = "alloc B/s: not counted exactly here (the sampled rate is above)";
        frame.render_widget(Paragraph::new(text), left);
    }
    if picture.settings.alloc_only {
        frame.render_widget(Paragraph::new("live heap: not tracked"), right);
    } else {
        let max_live = live.iter().copied().max().unwrap_or(0);
        spark(
            format!(
                "live heap, last {}s (max {})",
                live.len(),
                compact_bytes(max_live as f64)
            ),
            &live,
            right,
            frame,
        );
    }
}

/// The columns that fit in `width`, leaving the function at least 30 cells.
fn fitting_columns(all: &[Column], width: u16) -> Vec<Column> {
    let mut columns: Vec<Column> = all.to_vec();
    let needed =
        |columns: &[Column]| -> u16 { columns.iter().map(|c| c.width() + 1).sum::<u16>() + 30 };
    // Drop the least essential first: objects, the average rate, samples.
    for drop in [
        Column::Objects,
        Column::LeakedObjects,
        Column::Average,
        Column::Samples,
    ] {
        if needed(&columns) <= width {
            break;
        }
        if columns.len() > 1 {
            columns.retain(|c| *c != drop);
        }
    }
    while needed(&columns) > width && columns.len() > 1 {
        columns.pop();
    }
    columns
}

fn draw_table(frame: &mut Frame, area: Rect, app: &mut App) {
    let settings = app.picture().settings;
    let columns = fitting_columns(app.columns(), area.width);
    let sort = app.sort_column();
    let header = TableRow::new(
        columns
            .iter()
            .map(|c| {
                let title = c.title(&settings);
                if *c == sort {
                    Cell::from(format!("{title}▼")).bold()
                } else {
                    Cell::from(title)
                }
            })
            .chain([Cell::from("SITE ← CALLER")]),
    )
    .style(Style::new().add_modifier(Modifier::REVERSED));
    let height = area.height.saturating_sub(1) as usize;
    app.page = height;
    let (mut lines, selected_start, selected_end) = table_lines(app, &columns);
    if lines.is_empty() {
        let message = if app.filter().is_some() {
            "no stack matches the filter (Esc clears it)"
        } else if app.view() == View::Leaks {
            "no sampled allocation has been live longer than the leak age yet"
        } else if app.view() == View::Temporary {
            "no sampled block has been freed within 1 ms yet"
        } else {
            "no samples yet: waiting for allocations"
        };
        lines.push(name_only(&columns, Cell::from(message).italic()));
    }
    // Scroll so the selected row and as much of its expansion as fits are visible.
    let mut offset = (selected_end + 1).saturating_sub(height);
    offset = offset.min(selected_start);
    let visible: Vec<TableRow> = lines.into_iter().skip(offset).take(height).collect();
    let widths: Vec<Constraint> = columns
        .iter()
        .map(|c| Constraint::Length(c.width()))
        .chain([Constraint::Min(10)])
        .collect();
    frame.render_widget(
        Table::new(visible, widths).header(header).column_spacing(1),
        area,
    );
}

/// Every display line: group rows, and under expanded ones their stacks; with the first
/// and last line of the selected row.
fn table_lines(app: &App, columns: &[Column]) -> (Vec<TableRow<'static>>, usize, usize) {
    let mut lines: Vec<TableRow> = Vec::new();
    let (mut selected_start, mut selected_end) = (0, 0);
    for (index, row) in app.rows().iter().enumerate() {
        let selected = index == app.selected();
        if selected {
            selected_start = lines.len();
        }
        let uncertain = row.values.uncertain();
        let mut style = Style::new();
        if uncertain {
            style = style.add_modifier(Modifier::DIM);
        }
        if selected {
            style = style.add_modifier(Modifier::REVERSED);
        }
        let expander = if app.is_expanded(row) { "▾" } else { "▸" };
        let marker = if uncertain { "~" } else { " " };
        let mut label = format!("{expander}{marker}{}", row.label());
        if !row.module.is_empty() {
            label.push_str(&format!("  ({})", row.module));
        }
        if !row.key.command.is_empty() {
            label = format!("{label}  [{} ×{}]", row.key.command, row.processes);
        } else if app.picture().targets.len() > 1 {
            label = format!("{label}  [{}]", row.key.pid);
        }
        lines.push(
            TableRow::new(
                columns
                    .iter()
                    .map(|c| Cell::from(c.cell(&row.values)))
                    .chain([Cell::from(label)]),
            )
            .style(style),
        );
        if app.is_expanded(row) {
            expansion(&mut lines, columns, row);
        }
        if selected {
            selected_end = lines.len().saturating_sub(1);
        }
    }
    (lines, selected_start, selected_end)
}

/// The stacks of an expanded row: each one's values (when there are several) and frames.
fn expansion(lines: &mut Vec<TableRow<'static>>, columns: &[Column], row: &model::Row) {
    let several = row.members.len() > 1;
    for (m, member) in row.members.iter().enumerate() {
        if several {
            lines.push(TableRow::new(
                columns
                    .iter()
                    .map(|c| Cell::from(c.cell(&member.values)).dim())
                    .chain([
                        Cell::from(format!("  stack {} of {}", m + 1, row.members.len())).italic(),
                    ]),
            ));
        }
        if !member.sizes.is_empty() {
            lines.push(name_only(
                columns,
                Cell::from(format!("  sizes: {}", member.sizes)).dim(),
            ));
        }
        for (depth, text) in member.frames.iter().enumerate() {
            let branch = if depth + 1 == member.frames.len() {
                "└"
            } else {
                "│"
            };
            lines.push(name_only(
                columns,
                Cell::from(format!("  {branch} {text}")).dim(),
            ));
        }
    }
}

/// A table line with only the name column filled.
fn name_only<'a>(columns: &[Column], name: Cell<'a>) -> TableRow<'a> {
    TableRow::new(columns.iter().map(|_| Cell::from("")).chain([name]))
}

fn draw_status(frame: &mut Frame, area: Rect, app: &App) {
    let line = if let Some(input) = app.input() {
        Line::from(vec![
            Span::from("filter (regex on function or module, Enter applies, Esc cancels): /")
                .bold(),
            Span::from(format!("{input}_")),
        ])
    } else {
        let mut spans = Vec::new();
        if let Some(filter) = app.filter() {
            spans.push(Span::from(format!("filter /{filter}/ (Esc clears)  ")).yellow());
        }
        let rows = app.rows().len();
        spans.push(Span::from(format!("{rows} groups  ")));
        let uncertain = app.rows().iter().filter(|r| r.values.uncertain()).count();
        if uncertain > 0 {
            spans.push(
                Span::from(format!(
                    "~ = under {} samples ({uncertain})  ",
                    model::UNCERTAIN_SAMPLES
                ))
                .dim(),
            );
        }
        spans.push(Span::from(app.status().to_owned()));
        Line::from(spans)
    };
    frame.render_widget(Paragraph::new(line), area);
}

fn draw_help(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let width = area.width.min(76);
    let height = area.height.min(20);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    let settings = &app.picture().settings;
    let text = vec![
        Line::from("Keys").bold(),
        Line::from("  q, Ctrl-C   quit: restores the terminal, detaches every probe"),
        Line::from("  ↑↓ j k      move     PgUp PgDn Home End  jump"),
        Line::from("  Enter       expand/collapse the selected row's stacks"),
        Line::from("  s           sort by the next column (▼ marks it)"),
        Line::from("  p           pause the display (sampling goes on)"),
        Line::from("  /           filter by function or module (regex); Esc clears"),
        Line::from(format!(
            "  l           leak view: live for longer than {}",
            model::seconds_label(settings.leak_age_seconds)
        )),
        Line::from("  r           growth view: stacks by how fast their in-use bytes grow"),
        Line::from("  t           temporary view: bytes freed within 1 ms of allocation"),
        Line::from("  T           thread view: what each thread allocated"),
        Line::from("  w           write a snapshot file now (--format, into --output)"),
        Line::from(""),
        Line::from("Numbers").bold(),
        Line::from(format!(
            "  Estimates from samples, ± is half the {} interval, relative.",
            format::percent(settings.confidence)
        )),
        Line::from(format!(
            "  ~ marks rows with under {} samples: treat as rough.",
            model::UNCERTAIN_SAMPLES
        )),
        Line::from("  Rows group stacks by site (first frame past the allocator) and caller."),
        Line::from("  Live numbers count blocks allocated since allocscope attached."),
    ];
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" help (any key closes) ")),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use crossterm::event::{KeyCode, KeyEvent};
    use ratatui::{backend::TestBackend, buffer::Buffer, Terminal};

    use super::*;
    use crate::{
        commands::top::{
            app::Action,
            model::{rows, ProbeCost, RowQuery, TargetState, Totals, ViewSettings},
        },
        profile::{ProcessTally, StackTally, Tally},
        stacks::symbolize::FrameInfo,
        stats::{SampleObs, SampleSet},
    };

    const INTERVAL: u64 = 65536;

    /// `n` samples of `size`-byte blocks.
    fn samples(n: u64, size: u64) -> SampleSet {
        let mut set = SampleSet::default();
        for _ in 0..n {
            set.add(SampleObs {
                size,
                offset: 0,
                interval: INTERVAL,
                weight: None,
            });
        }
        set
    }

    fn frame(function: &str, module: &str, line: u32) -> FrameInfo {
        FrameInfo {
            function: Some(function.into()),
            module: Some(format!("/opt/app/{module}").into()),
            file: Some("/src/app.c".into()),
            line: Some(line),
            address: 0x1000 + u64::from(line),
            kind: None,
        }
    }

    /// `(function, caller, module, all, live, recent)` per stack.
    fn stack(
        function: &str,
        caller: &str,
        module: &str,
        all: u64,
        live: u64,
        recent: u64,
    ) -> StackTally {
        StackTally {
            pid: 42,
            frames: vec![
                frame(function, module, 10),
                frame(caller, module, 20),
                frame("main", "app", 30),
            ],
            all: samples(all, 4096),
            live: samples(live, 4096),
            at_peak: samples(live, 4096),
            leaked: samples(live / 2, 4096),
            oldest_leaked_seconds: (live >= 2).then_some(40.0),
            period: SampleSet::default(),
            recent: samples(recent, 4096),
            lost: false,
            cut_to_leaf: false,
            origin: None,
            duty: None,
            id: None,
            breakdown: Default::default(),
            growth: Default::default(),
        }
    }

    /// Four groups, one of them two stacks; `rare_site` has two samples (uncertain).
    fn picture() -> Picture {
        Picture {
            elapsed_seconds: 30.0,
            settings: ViewSettings {
                interval: INTERVAL,
                window_seconds: 10.0,
                ..ViewSettings::default()
            },
            targets: vec![TargetState {
                pid: 42,
                command: "app".into(),
                exited: false,
            }],
            totals: Totals {
                calls_per_second: 12_000.0,
                bytes_per_second: 3.0e6,
                samples_per_second: 45.0,
                lost: 0,
                cost: ProbeCost {
                    cores: 0.015,
                    share: Some(0.042),
                    ns_per_call: 930.0,
                },
            },
            tally: Tally {
                stacks: vec![
                    stack("hot_alloc", "parse_request", "app", 400, 10, 200),
                    stack("grow_cache", "handle", "libcache.so", 150, 140, 20),
                    // Same function and caller, reached from elsewhere: one group.
                    StackTally {
                        frames: vec![
                            frame("grow_cache", "libcache.so", 10),
                            frame("handle", "libcache.so", 20),
                            frame("worker", "app", 40),
                        ],
                        ..stack("grow_cache", "handle", "libcache.so", 50, 50, 5)
                    },
                    stack("rare_site", "startup", "app", 2, 2, 0),
                    stack("churn", "loop_body", "app", 100, 0, 60),
                ],
                processes: vec![ProcessTally {
                    pid: 42,
                    command: "app".into(),
                    executable: "/opt/app/app".into(),
                    rss_bytes: Some(64 << 20),
                    anon_first_and_peak: None,
                    cpu_seconds: None,
                    untracked_samples: 0,
                    lost_samples: 0,
                    runtime_hits: 0,
                    cgroup: None,
                    allocators: Vec::new(),
                    duty: None,
                    go_totals: None,
                    not_loaded: None,
                    incomplete: Vec::new(),
                }],
                recent_seconds: 10.0,
                ..Tally::default()
            },
            history: (0..60)
                .map(|i| model::HistoryPoint {
                    bytes_per_second: 3.0e6,
                    live_bytes: f64::from(i) * 1e5,
                })
                .collect(),
            finished: false,
        }
    }

    fn app() -> App {
        let mut app = App::default();
        app.update(picture());
        app
    }

    fn render(app: &mut App, width: u16, height: u16) -> Buffer {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|frame| draw(frame, app)).unwrap();
        terminal.backend().buffer().clone()
    }

    fn text(buffer: &Buffer) -> String {
        let area = buffer.area;
        (0..area.height)
            .map(|y| {
                (0..area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The row (line index) whose text contains `needle`.
    fn line_of(buffer: &Buffer, needle: &str) -> u16 {
        let screen = text(buffer);
        screen
            .lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} not on screen:\n{screen}")) as u16
    }

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::from(code)
    }

    fn press(app: &mut App, keys: &str) {
        for c in keys.chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
    }

    #[test]
    fn the_live_heap_counts_from_the_start_of_a_command_and_from_attach_otherwise() {
        let mut view = picture();
        assert!(header_heap_and_cost(&view).contains("(since attach)"));
        view.settings.from_start = true;
        assert!(header_heap_and_cost(&view).contains("(since it started)"));
    }

    #[test]
    fn many_processes_are_rows_by_command() {
        // Ten processes: nine `cc1` and the `make` that started them. The same site in two
        // cc1 processes is one row, its sets merged; the thread view stays per process.
        let mut picture = picture();
        picture.targets = (1..=10)
            .map(|pid| TargetState {
                pid,
                command: if pid == 10 { "make" } else { "cc1" }.into(),
                exited: false,
            })
            .collect();
        let mut first = stack("xmalloc", "parse", "cc1", 100, 10, 50);
        let mut second = stack("xmalloc", "parse", "cc1", 300, 30, 150);
        let mut make = stack("xmalloc", "parse", "make", 20, 2, 10);
        (first.pid, second.pid, make.pid) = (1, 2, 10);
        picture.tally.stacks = vec![first, second, make];
        let rows = rows(&picture, &RowQuery::default());
        assert_eq!(rows.len(), 2, "{rows:#?}");
        let cc1 = &rows[0];
        assert_eq!((cc1.key.command.as_str(), cc1.key.pid), ("cc1", 0));
        assert_eq!((cc1.processes, cc1.values.samples), (2, 400));
        assert_eq!(rows[1].key.command, "make");
        let mut app = App::default();
        app.update(picture);
        let screen = text(&render(&mut app, 120, 24));
        assert!(
            screen.contains("parse ← main [via xmalloc]  (cc1)  [cc1 ×2]"),
            "{screen}"
        );
        assert!(screen.contains("[make ×1]"), "{screen}");
    }

    #[test]
    fn stacks_group_by_function_and_caller_with_merged_bounds() {
        let rows = rows(&picture(), &RowQuery::default());
        let labels: Vec<String> = rows.iter().map(|r| r.label()).collect();
        // Sorted by the window's rate: 200, 60, 25 (two stacks), 0 recent samples.
        assert_eq!(
            labels,
            [
                "hot_alloc ← parse_request",
                "churn ← loop_body",
                "grow_cache ← handle",
                "rare_site ← startup"
            ]
        );
        let grow = &rows[2];
        assert_eq!(grow.members.len(), 2);
        assert_eq!(grow.values.samples, 200);
        // The group's estimate is the sum of its members' (Horvitz-Thompson is additive)...
        let sum: f64 = grow
            .members
            .iter()
            .map(|m| m.values.live.unwrap().estimate)
            .sum();
        let live = grow.values.live.unwrap();
        assert!((live.estimate - sum).abs() < 1e-6 * sum);
        // ...but its interval is the group's own, narrower than the sum of the members'.
        let summed_width: f64 = grow
            .members
            .iter()
            .map(|m| m.values.live.unwrap().upper - m.values.live.unwrap().lower)
            .sum();
        assert!(live.upper - live.lower < summed_width);
        assert!(rows[3].values.uncertain() && !rows[0].values.uncertain());
    }

    #[test]
    fn renders_in_80_by_24_with_uncertain_rows_marked() {
        let mut app = app();
        let buffer = render(&mut app, 80, 24);
        let screen = text(&buffer);
        assert!(screen.contains("pid 42 (app)"), "{screen}");
        assert!(screen.contains("RSS 64.0M"), "{screen}");
        assert!(screen.contains("probes +4.2% CPU, 930ns/call"), "{screen}");
        assert!(screen.contains("RATE 10s▼"), "{screen}");
        assert!(screen.contains("q quit"), "footer:\n{screen}");
        for view in ["l leaks", "r growth", "t temp", "T threads"] {
            assert!(screen.contains(view), "footer:\n{screen}");
        }
        // 80 columns: the objects column gives way, the function keeps 30+ cells.
        assert!(!screen.contains("LIVE OBJ"), "{screen}");
        assert!(
            screen.contains("▸ hot_alloc ← parse_request  (app)"),
            "{screen}"
        );
        // The uncertain row: a `~` and dimmed; certain rows are not.
        let rare = line_of(&buffer, "rare_site");
        let hot = line_of(&buffer, "hot_alloc");
        assert!(screen
            .lines()
            .nth(rare as usize)
            .unwrap()
            .contains("▸~rare_site"));
        assert!(buffer[(0, rare)].modifier.contains(Modifier::DIM));
        assert!(!buffer[(0, hot)].modifier.contains(Modifier::DIM));
        // The first row is selected (reversed).
        assert!(buffer[(0, hot)].modifier.contains(Modifier::REVERSED));
        assert!(screen.contains("~ = under 5 samples (1)"), "{screen}");
        // Wider: every column.
        let wide = text(&render(&mut app, 120, 30));
        assert!(wide.contains("LIVE OBJ"), "{wide}");
    }

    #[test]
    fn a_go_process_has_an_exact_rate_where_its_runtime_totals_are_read() {
        let header = |picture: &Picture| -> String {
            let line = header_rates(picture);
            line.spans.iter().map(|s| s.content.as_ref()).collect()
        };
        let mut picture = picture();
        picture.tally.processes[0].allocators = vec!["go runtime (go1.19.8) (/opt/app/app)".into()];
        // Built without DWARF: its runtime's totals are not read, its calls are not counted.
        assert!(
            header(&picture).contains("exact n/a"),
            "{}",
            header(&picture)
        );
        let totals = crate::schema::ExactCounts {
            calls: 10,
            bytes: 1000,
        };
        picture.tally.processes[0].go_totals = Some((totals, "runtime.memstats".into()));
        let shown = header(&picture);
        assert!(
            shown.contains("exact ") && !shown.contains("n/a"),
            "{shown}"
        );
    }

    #[test]
    fn narrow_and_tiny_terminals_still_draw() {
        let mut app = app();
        let screen = text(&render(&mut app, 50, 12));
        assert!(screen.contains("hot_alloc"), "{screen}");
        assert!(screen.contains("RATE 10s"), "{screen}");
        assert!(!screen.contains("RATE all"), "{screen}");
        // Too small to be useful, but no panic.
        render(&mut app, 10, 4);
        render(&mut app, 1, 1);
    }

    #[test]
    fn keys_sort_expand_filter_and_toggle_views() {
        let mut app = app();
        // s: sort by the next column (the average rate), then live bytes.
        press(&mut app, "s");
        assert_eq!(app.sort_column(), Column::Average);
        press(&mut app, "s");
        assert_eq!(app.sort_column(), Column::Live);
        let screen = text(&render(&mut app, 100, 30));
        assert!(screen.contains("LIVE▼"), "{screen}");
        assert_eq!(app.rows()[0].key.function, "grow_cache");
        // The selection stayed on hot_alloc, now further down; Enter expands it.
        let selected = &app.rows()[app.selected()];
        assert_eq!(selected.key.function, "hot_alloc");
        app.on_key(key(KeyCode::Enter));
        let screen = text(&render(&mut app, 100, 30));
        assert!(screen.contains("▾ hot_alloc"), "{screen}");
        assert!(screen.contains("│ parse_request  app.c:20"), "{screen}");
        assert!(screen.contains("└ main  app.c:30"), "{screen}");
        // A group of two stacks shows each with its own numbers.
        app.on_key(key(KeyCode::Home));
        app.on_key(key(KeyCode::Enter));
        let screen = text(&render(&mut app, 100, 40));
        assert!(screen.contains("stack 1 of 2"), "{screen}");
        assert!(screen.contains("└ worker  app.c:40"), "{screen}");
        // /: a regex on functions or modules.
        press(&mut app, "/libcache");
        assert_eq!(app.input(), Some("libcache"));
        app.on_key(key(KeyCode::Enter));
        assert_eq!(app.rows().len(), 1);
        let screen = text(&render(&mut app, 100, 30));
        assert!(screen.contains("filter /libcache/"), "{screen}");
        assert!(!screen.contains("hot_alloc"), "{screen}");
        // A bad regex is refused with a message; the old filter stays.
        press(&mut app, "/(");
        app.on_key(key(KeyCode::Enter));
        assert!(app.status().contains("invalid regex"), "{}", app.status());
        assert_eq!(app.filter(), Some("libcache"));
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.rows().len(), 4);
        // l: only stacks with blocks live longer than the leak age.
        press(&mut app, "l");
        let screen = text(&render(&mut app, 100, 30));
        assert!(
            screen.contains("LEAKS") && screen.contains(">30s LIVE▼"),
            "{screen}"
        );
        assert!(!screen.contains("churn"), "{screen}");
        press(&mut app, "l");
        // p: pictures are ignored until p again.
        press(&mut app, "p");
        let mut later = picture();
        later.elapsed_seconds = 99.0;
        app.update(later.clone());
        assert_eq!(app.picture().elapsed_seconds, 30.0);
        assert!(text(&render(&mut app, 100, 30)).contains("PAUSED"));
        press(&mut app, "p");
        app.update(later);
        assert_eq!(app.picture().elapsed_seconds, 99.0);
        // ?: help; any key closes it.
        press(&mut app, "?");
        assert!(text(&render(&mut app, 80, 24)).contains("help (any key closes)"));
        press(&mut app, "x");
        assert!(!app.help());
        assert_eq!(app.on_key(key(KeyCode::Char('w'))), Action::WriteSnapshot);
        assert_eq!(app.on_key(key(KeyCode::Char('q'))), Action::Quit);
    }

    #[test]
    fn exited_and_alloc_only_pictures() {
        let mut app = App::default();
        let mut p = picture();
        p.finished = true;
        p.targets[0].exited = true;
        p.settings.alloc_only = true;
        app.update(p);
        let screen = text(&render(&mut app, 100, 30));
        assert!(
            screen.contains("42 (app) exited") && screen.contains("EXITED"),
            "{screen}"
        );
        assert!(screen.contains("live heap not tracked"), "{screen}");
        let many: Vec<model::TargetState> = (0..5)
            .map(|pid| model::TargetState {
                pid,
                command: "worker".into(),
                exited: pid < 2,
            })
            .collect();
        assert_eq!(targets_label(&many), " · 5 processes, 3 running");
        assert!(!screen.contains("LIVE"), "{screen}");
        press(&mut app, "l");
        assert!(app.status().contains("--alloc-only"));
        // No samples yet: the table says so.
        let mut empty = App::default();
        empty.update(Picture::default());
        assert!(text(&render(&mut empty, 80, 24)).contains("no samples yet"));
    }

    /// `r`, `t` and `T` switch to the growth, temporary and thread views (and back).
    #[test]
    fn growth_temporary_and_thread_views() {
        use crate::{
            profile::{Breakdown, Timeline},
            stats::growth::{GrowthSums, TickGrid},
        };
        const SECOND: u64 = 1_000_000_000;
        let mut picture = picture();
        let grid = TickGrid {
            start_ns: 0,
            tick_ns: SECOND,
        };
        picture.tally.timeline = Some(Timeline::new(grid));
        picture.tally.ticks = 30;
        let obs = SampleObs {
            size: 4096,
            offset: 0,
            interval: 1,
            weight: None,
        };
        // grow_cache (its first stack) leaks a block every second (every block sampled).
        let mut growing = GrowthSums::default();
        for i in 0..30 {
            growing.add(obs, grid.span(i * SECOND, u64::MAX, 30));
        }
        picture.tally.stacks[1].growth = growing;
        // churn's blocks are freed within a microsecond; threads alpha and beta allocate.
        let mut breakdown = Breakdown::default();
        for (tid, count) in [(7, 40), (8, 20)] {
            for _ in 0..count {
                breakdown.add(obs, tid);
            }
        }
        for _ in 0..10 {
            breakdown.freed(obs, 5 * SECOND, 5 * SECOND + 900, &grid);
        }
        picture.tally.stacks[4].breakdown = breakdown;
        picture.tally.thread_names = [((42, 7), "alpha".to_owned()), ((42, 8), "beta".to_owned())]
            .into_iter()
            .collect();
        let mut app = App::default();
        app.update(picture.clone());

        app.on_key(key(KeyCode::Char('r')));
        assert_eq!(app.view(), View::Growth);
        assert_eq!(app.rows()[0].key.function, "grow_cache");
        let screen = text(&render(&mut app, 140, 30));
        assert!(screen.contains("GROWTH"), "{screen}");
        // About 4 KiB a second (the last block lives at one tick only), exactly: every
        // block was sampled; and growing.
        assert!(screen.contains("+3.97K/s ±0% ▲"), "{screen}");

        app.on_key(key(KeyCode::Char('t')));
        assert_eq!(app.view(), View::Temporary);
        let functions: Vec<&str> = app.rows().iter().map(|r| r.key.function.as_str()).collect();
        assert_eq!(functions, ["churn"]);

        app.on_key(key(KeyCode::Char('T')));
        let threads: Vec<&str> = app.rows().iter().map(|r| r.key.function.as_str()).collect();
        assert_eq!(threads, ["alpha (7)", "beta (8)"]);
        let screen = text(&render(&mut app, 140, 30));
        assert!(
            screen.contains("THREADS") && screen.contains("OBJECTS"),
            "{screen}"
        );
        app.on_key(key(KeyCode::Char('T')));
        assert_eq!(app.view(), View::Stacks);

        // The expanded row says what sizes its stack asked for.
        app.on_key(key(KeyCode::Home));
        let churn = app
            .rows()
            .iter()
            .position(|r| r.key.function == "churn")
            .unwrap();
        for _ in 0..churn {
            app.on_key(key(KeyCode::Down));
        }
        app.on_key(key(KeyCode::Enter));
        let screen = text(&render(&mut app, 140, 40));
        assert!(screen.contains("sizes: ≤4.00K 100%"), "{screen}");

        // Without frees tracked there is no growth view.
        picture.settings.alloc_only = true;
        let mut app = App::default();
        app.update(picture);
        app.on_key(key(KeyCode::Char('r')));
        assert_eq!(app.view(), View::Stacks);
        assert!(app.status().contains("no growth view"), "{}", app.status());
    }
}
