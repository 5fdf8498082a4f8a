//! The view's state and what each key does to it: no terminal here, so key handling is
//! tested by feeding key events.

use std::collections::HashSet;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use regex::Regex;

use super::model::{self, Column, GroupKey, Picture, Row, RowQuery, View};

/// The status line until the first picture arrives.
pub const STARTING: &str = "starting: the first numbers come within a second (? for help)";

/// What the event loop must do after a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing beyond redrawing.
    None,
    /// Leave: restore the terminal, detach.
    Quit,
    /// Write a snapshot file now.
    WriteSnapshot,
}

/// State of the view.
#[derive(Debug, Default)]
pub struct App {
    picture: Picture,
    rows: Vec<Row>,
    selected: usize,
    selected_key: Option<GroupKey>,
    expanded: HashSet<GroupKey>,
    sort: Option<Column>,
    view: View,
    paused: bool,
    filter: Option<Regex>,
    /// The filter being typed after `/`.
    input: Option<String>,
    help: bool,
    status: String,
    /// Table rows visible at the last draw (for page up/down).
    pub page: usize,
}

impl App {
    /// Takes a new picture (ignored while paused).
    pub fn update(&mut self, picture: Picture) {
        if self.paused {
            return;
        }
        if self.status == STARTING {
            self.status.clear();
        }
        self.picture = picture;
        self.rebuild();
    }

    /// Shows `message` in the status line.
    pub fn set_status(&mut self, message: impl Into<String>) {
        self.status = message.into();
    }

    /// Handles one key press.
    pub fn on_key(&mut self, key: KeyEvent) -> Action {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if let Some(input) = &mut self.input {
            match key.code {
                KeyCode::Enter => {
                    let text = std::mem::take(input);
                    self.input = None;
                    self.apply_filter(&text);
                }
                KeyCode::Esc => self.input = None,
                KeyCode::Backspace => {
                    input.pop();
                }
                KeyCode::Char(c) => input.push(c),
                _ => {}
            }
            return Action::None;
        }
        if self.help {
            // Any key closes the help; q still quits.
            self.help = false;
            if key.code != KeyCode::Char('q') {
                return Action::None;
            }
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Esc if self.filter.is_some() => {
                self.filter = None;
                self.set_status("filter cleared");
                self.rebuild();
            }
            KeyCode::Down | KeyCode::Char('j') => self.select(self.selected.saturating_add(1)),
            KeyCode::Up | KeyCode::Char('k') => self.select(self.selected.saturating_sub(1)),
            KeyCode::PageDown => self.select(self.selected.saturating_add(self.page.max(1))),
            KeyCode::PageUp => self.select(self.selected.saturating_sub(self.page.max(1))),
            KeyCode::Home | KeyCode::Char('g') => self.select(0),
            KeyCode::End | KeyCode::Char('G') => self.select(usize::MAX),
            KeyCode::Enter => {
                if let Some(key) = self.selected_key.clone() {
                    if !self.expanded.remove(&key) {
                        self.expanded.insert(key);
                    }
                }
            }
            KeyCode::Char('s') => {
                let columns = self.columns();
                let current = columns
                    .iter()
                    .position(|c| Some(*c) == self.sort)
                    .unwrap_or(0);
                self.sort = Some(columns[(current + 1) % columns.len()]);
                self.rebuild();
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.paused = !self.paused;
                self.set_status(if self.paused {
                    "paused: the numbers are frozen (sampling goes on); p resumes"
                } else {
                    "resumed"
                });
            }
            KeyCode::Char('/') => self.input = Some(String::new()),
            KeyCode::Char('l') => self.toggle_view(View::Leaks),
            KeyCode::Char('r') => self.toggle_view(View::Growth),
            KeyCode::Char('t') => self.toggle_view(View::Temporary),
            KeyCode::Char('T') => self.toggle_view(View::Threads),
            KeyCode::Char('w') => return Action::WriteSnapshot,
            KeyCode::Char('?') | KeyCode::F(1) | KeyCode::Char('h') => self.help = true,
            _ => {}
        }
        Action::None
    }

    /// Switches to `view`, or back to the stacks when it is on.
    fn toggle_view(&mut self, view: View) {
        if view.needs_frees() && self.picture.settings.alloc_only {
            self.set_status(format!(
                "no {} view with --alloc-only: frees are not tracked",
                view.tag().unwrap_or_default().to_lowercase()
            ));
            return;
        }
        self.view = if self.view == view {
            View::Stacks
        } else {
            view
        };
        self.sort = None;
        self.rebuild();
    }

    fn apply_filter(&mut self, text: &str) {
        if text.is_empty() {
            self.filter = None;
            self.set_status("filter cleared");
        } else {
            match Regex::new(text) {
                Ok(regex) => {
                    self.filter = Some(regex);
                    self.set_status("");
                }
                Err(e) => {
                    let first = e.to_string();
                    let reason = first.lines().last().unwrap_or("invalid").trim();
                    self.set_status(format!("invalid regex {text:?}: {reason}"));
                }
            }
        }
        self.selected = 0;
        self.selected_key = None;
        self.rebuild();
    }

    /// Recomputes the rows and keeps the selection on the same group where it still exists.
    fn rebuild(&mut self) {
        let query = RowQuery {
            sort: self.sort,
            filter: self.filter.as_ref(),
            view: self.view,
        };
        self.rows = model::rows(&self.picture, &query);
        let found = self
            .selected_key
            .as_ref()
            .and_then(|key| self.rows.iter().position(|row| &row.key == key));
        self.select(found.unwrap_or(self.selected));
    }

    fn select(&mut self, index: usize) {
        if self.rows.is_empty() {
            self.selected = 0;
            return;
        }
        self.selected = index.min(self.rows.len() - 1);
        self.selected_key = Some(self.rows[self.selected].key.clone());
    }

    /// The visible columns.
    pub fn columns(&self) -> &'static [Column] {
        Column::visible(self.picture.settings.alloc_only, self.view)
    }

    /// The column rows are sorted by.
    pub fn sort_column(&self) -> Column {
        self.sort.unwrap_or(self.columns()[0])
    }

    /// The current picture.
    pub fn picture(&self) -> &Picture {
        &self.picture
    }

    /// The rows, sorted and filtered.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Index of the selected row.
    pub fn selected(&self) -> usize {
        self.selected
    }

    /// Whether `row` is expanded.
    pub fn is_expanded(&self, row: &Row) -> bool {
        self.expanded.contains(&row.key)
    }

    /// Paused.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// The table shown.
    pub fn view(&self) -> View {
        self.view
    }

    /// The filter in force.
    pub fn filter(&self) -> Option<&str> {
        self.filter.as_ref().map(Regex::as_str)
    }

    /// The filter being typed.
    pub fn input(&self) -> Option<&str> {
        self.input.as_deref()
    }

    /// Help shown.
    pub fn help(&self) -> bool {
        self.help
    }

    /// Status line.
    pub fn status(&self) -> &str {
        &self.status
    }
}
