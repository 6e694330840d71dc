//! Reading the destination a transparent client means from its first bytes:
//! the server name of a TLS ClientHello, or the Host of an HTTP request.
//! Strict, bounds-checked parsing of untrusted input; anything unexpected
//! is "not this protocol", never a guess.

/// The most a client may send before its destination must be known.
pub const MAX_SNIFF: usize = 16 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough bytes yet to decide.
    NeedMore,
    /// A TLS ClientHello, with its server name if it sent one.
    Tls(Option<String>),
    /// An HTTP/1 request, with its Host header if it sent one.
    Http(Option<String>),
    /// Neither.
    Unknown,
}

pub fn sniff(buf: &[u8]) -> Sniffed {
    if buf.is_empty() {
        return Sniffed::NeedMore;
    }
    if buf[0] == 22 {
        return tls_server_name(buf);
    }
    http_host(buf)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }
    /// The next `u16`-length-prefixed field, as a reader of its own.
    fn field16(&mut self) -> Option<Reader<'a>> {
        let len = self.u16()?;
        self.take(len).map(Reader::new)
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| ((b[0] as usize) << 16) | ((b[1] as usize) << 8) | b[2] as usize)
    }
}

fn tls_server_name(buf: &[u8]) -> Sniffed {
    if buf.len() < 5 {
        return Sniffed::NeedMore;
    }
    if buf[1] != 3 {
        return Sniffed::Unknown;
    }
    let record_len = u16::from_be_bytes([buf[3], buf[4]]) as usize;
    if record_len == 0 || record_len > MAX_SNIFF {
        return Sniffed::Unknown;
    }
    let Some(record) = buf.get(5..5 + record_len) else {
        return Sniffed::NeedMore;
    };
    // A ClientHello split over several records has no SNI we can trust in
    // the first one; treat it as missing.
    match client_hello_sni(record) {
        Some(name) => Sniffed::Tls(name),
        None => Sniffed::Unknown,
    }
}

/// `Some(None)`: a well-formed ClientHello without a server name.
fn client_hello_sni(record: &[u8]) -> Option<Option<String>> {
    let mut r = Reader::new(record);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.u24()?;
    let mut r = Reader::new(r.take(len).unwrap_or(&record[4..]));
    r.take(2 + 32)?; // version, random
    let sid = r.u8()?;
    r.take(sid)?;
    let suites = r.u16()?;
    r.take(suites)?;
    let comp = r.u8()?;
    r.take(comp)?;
    if r.pos == r.buf.len() {
        return Some(None); // no extensions at all
    }
    let mut ext = r.field16()?;
    while ext.pos < ext.buf.len() {
        let kind = ext.u16()?;
        let mut body = ext.field16()?;
        if kind != 0 {
            continue;
        }
        let mut list = body.field16()?;
        while list.pos < list.buf.len() {
            let name_type = list.u8()?;
            let len = list.u16()?;
            let name = list.take(len)?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Some(name.to_string()));
            }
        }
        return Some(None);
    }
    Some(None)
}

fn http_host(buf: &[u8]) -> Sniffed {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {
            let host = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .map(|h| h.trim().to_string());
            Sniffed::Http(host)
        }
        Ok(httparse::Status::Partial) if buf.len() < MAX_SNIFF => {
            // A partial parse only means "HTTP so far" once a method is in.
            Sniffed::NeedMore
        }
        _ => Sniffed::Unknown,
    }
}

/// Splits `host[:port]` (or `[v6]:port`) from a Host header or CONNECT
/// authority.
pub fn split_authority(auth: &str) -> (&str, Option<&str>) {
    if auth.starts_with('[') {
        if let Some(end) = auth.find(']') {
            let port = auth[end + 1..].strip_prefix(':');
            return (&auth[..=end], port);
        }
        return (auth, None);
    }
    match auth.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (auth, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello carrying `name` as SNI.
    pub(crate) fn client_hello(name: Option<&str>) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(name) = name {
            let n = name.as_bytes();
            let mut sni = Vec::new();
            sni.extend_from_slice(&((n.len() + 3) as u16).to_be_bytes());
            sni.push(0);
            sni.extend_from_slice(&(n.len() as u16).to_be_bytes());
            sni.extend_from_slice(n);
            ext.extend_from_slice(&0u16.to_be_bytes());
            ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
            ext.extend_from_slice(&sni);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn reads_the_server_name_and_waits_for_the_whole_record() {
        let hello = client_hello(Some("pypi.org"));
        assert_eq!(sniff(&hello), Sniffed::Tls(Some("pypi.org".into())));
        assert_eq!(sniff(&hello[..hello.len() - 1]), Sniffed::NeedMore);
        assert_eq!(sniff(&client_hello(None)), Sniffed::Tls(None));
    }

    #[test]
    fn reads_the_http_host() {
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nHost: a.test:8080\r\n\r\n"),
            Sniffed::Http(Some("a.test:8080".into()))
        );
        assert_eq!(sniff(b"GET / HTTP/1.1\r\nHo"), Sniffed::NeedMore);
        assert_eq!(sniff(b"GET / HTTP/1.0\r\n\r\n"), Sniffed::Http(None));
        assert_eq!(sniff(b"SSH-2.0-OpenSSH\r\n"), Sniffed::Unknown);
    }

    #[test]
    fn garbage_is_unknown_not_a_panic() {
        for len in 0..200 {
            let mut hello = client_hello(Some("x.test"));
            hello.truncate(len.min(hello.len()));
            let _ = sniff(&hello);
            let mut bad = hello.clone();
            for b in bad.iter_mut().skip(5) {
                *b = 0xff;
            }
            let _ = sniff(&bad);
        }
        assert_eq!(split_authority("a.test:443"), ("a.test", Some("443")));
        assert_eq!(split_authority("[::1]:443"), ("[::1]", Some("443")));
        assert_eq!(split_authority("a.test"), ("a.test", None));
    }
}
