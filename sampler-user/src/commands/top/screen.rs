//! The terminal, on its own thread: raw mode and the alternate screen, keys in, frames out.
//!
//! Writing to a terminal can block (a slow SSH link, a stopped `tmux` pane). The sample
//! intake runs on the tokio thread and only ever `try_send`s pictures here, so a stuck
//! terminal costs dropped pictures, never lost samples.

use std::{
    io,
    sync::mpsc::{Receiver, TryRecvError},
    thread::JoinHandle,
    time::Duration,
};

use crossterm::event::{self, Event, KeyEventKind};
use tokio::sync::mpsc::UnboundedSender;

use super::{
    app::{Action, App},
    model::Picture,
    ui, LogBuffer,
};

/// From the recording to the screen.
pub enum ToScreen {
    /// A new picture.
    Picture(Box<Picture>),
    /// A message for the status line.
    Status(String),
}

/// From the screen to the recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FromScreen {
    /// The user quit.
    Quit,
    /// The user asked for a snapshot file.
    WriteSnapshot,
}

/// Takes over the terminal on a new thread; it gives the terminal back when the sender of
/// `incoming` is dropped or the user quits.
pub fn spawn(
    incoming: Receiver<ToScreen>,
    outgoing: UnboundedSender<FromScreen>,
    log: LogBuffer,
) -> io::Result<JoinHandle<io::Result<()>>> {
    std::thread::Builder::new()
        .name("allocscope-screen".into())
        .spawn(move || {
            // Raw mode, the alternate screen, and a panic hook that restores both.
            let mut terminal = ratatui::try_init()?;
            let result = run(&mut terminal, &incoming, &outgoing, &log);
            let restored = ratatui::try_restore();
            if result.is_err() {
                // The recording must not go on without a screen nobody can quit.
                let _ = outgoing.send(FromScreen::Quit);
            }
            result.and(restored)
        })
}

fn run(
    terminal: &mut ratatui::DefaultTerminal,
    incoming: &Receiver<ToScreen>,
    outgoing: &UnboundedSender<FromScreen>,
    log: &LogBuffer,
) -> io::Result<()> {
    let mut app = App::default();
    app.set_status(super::app::STARTING);
    let mut dirty = true;
    loop {
        loop {
            match incoming.try_recv() {
                Ok(ToScreen::Picture(picture)) => {
                    app.update(*picture);
                    dirty = true;
                }
                Ok(ToScreen::Status(message)) => {
                    app.set_status(message);
                    dirty = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Ok(()),
            }
        }
        if let Some(line) = log.unseen() {
            app.set_status(line);
            dirty = true;
        }
        if dirty {
            terminal.draw(|frame| ui::draw(frame, &mut app))?;
            dirty = false;
        }
        if event::poll(Duration::from_millis(100))? {
            match event::read()? {
                Event::Key(key) if key.kind == KeyEventKind::Press => {
                    dirty = true;
                    match app.on_key(key) {
                        Action::None => {}
                        Action::Quit => {
                            let _ = outgoing.send(FromScreen::Quit);
                            return Ok(());
                        }
                        Action::WriteSnapshot => {
                            app.set_status("writing a snapshot…");
                            let _ = outgoing.send(FromScreen::WriteSnapshot);
                        }
                    }
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
        }
    }
}
