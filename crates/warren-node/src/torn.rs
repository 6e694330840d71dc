//! Append-only files of whole lines (a sandbox's log, the shipping
//! journal) as a killed daemon leaves them.

use std::fs::File;

/// A daemon killed while it wrote a line can leave part of it (the kernel
/// stops a write between pages for a fatal signal); the next line would be
/// glued to it. The part is cut off, back to the last whole line: it is the
/// output in flight at the crash (docs/reliability.md). Returns the size.
pub(crate) fn drop_torn_line(file: &File) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let size = file.metadata()?.len();
    if size == 0 {
        return Ok(0);
    }
    let mut end = size;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        file.read_exact_at(chunk, start)?;
        if end == size && chunk.last() == Some(&b'\n') {
            return Ok(size);
        }
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            let whole = start + i as u64 + 1;
            file.set_len(whole)?;
            return Ok(whole);
        }
        if start == 0 {
            file.set_len(0)?;
            return Ok(0);
        }
        end = start;
    }
}
