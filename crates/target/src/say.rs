//! Messages for the user: on stderr (`say!`, `say_raw!`) and, for `report`'s table, stdout
//! (`show!`). `eprintln!` panics when the stream is closed (`allocscope record … 2>&1 |
//! true`, a terminal gone): the recording would be lost and the command's exit status with
//! it. These ignore write errors: a message nobody can read is dropped, the work goes on.

/// `eprintln!` that ignores a closed stderr.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that ignores a closed stderr.
#[macro_export]
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

/// `print!` that ignores a closed stdout.
#[macro_export]
macro_rules! show {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}
