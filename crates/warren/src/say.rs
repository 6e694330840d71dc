//! Messages for people on stderr, each written whole.
//!
//! Rust's stderr is unbuffered, so `eprintln!("{who}: stopping")` reaches
//! the kernel as three writes ("warren up", ": stopping", "\n"), and
//! anything else writing to the same terminal, pipe or log file in between
//! lands inside the line (a `warren up &` beside the shell that started
//! it, or daemons sharing a journal). A message is formatted first and
//! written with one `write`.

use std::io::Write;

/// Writes `text` to stderr in one piece; a closed stderr loses the message
/// and nothing else.
pub fn write(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `eprintln!`, written whole.
#[macro_export]
macro_rules! say {
    () => {
        $crate::say::write("\n")
    };
    ($($arg:tt)*) => {
        $crate::say::write(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprint!`, written whole (progress lines that end in `\r`).
#[macro_export]
macro_rules! say_partial {
    ($($arg:tt)*) => {
        $crate::say::write(&format!($($arg)*))
    };
}
