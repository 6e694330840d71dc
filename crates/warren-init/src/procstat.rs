//! `/proc/<pid>/stat`, read by field number as proc(5) numbers them.

pub(crate) struct Stat(Vec<String>);

/// Reads `/proc/<pid>/stat` (`pid` may be `self`).
pub(crate) fn read(pid: &str) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields that follow it start after its last ')'.
    let (_, rest) = text.rsplit_once(") ")?;
    Some(Stat(rest.split_whitespace().map(str::to_string).collect()))
}

impl Stat {
    /// Field `n` (1-based, as in proc(5)); fields 1 and 2 are not kept.
    pub(crate) fn field(&self, n: usize) -> Option<&str> {
        self.0.get(n.checked_sub(3)?).map(String::as_str)
    }
}
