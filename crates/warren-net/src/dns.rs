//! The sandbox's DNS stub: answers A queries for allowlisted names with an
//! address from the sandbox's own map (a loopback address the transparent
//! path turns back into the name), gives an empty answer for AAAA so
//! clients use IPv4, NXDOMAIN for every other name, and REFUSED for other
//! query types (TXT, NULL, ANY: the usual tunnelling carriers). Nothing is
//! ever forwarded, so no DNS leaves the sandbox.
//!
//! Hand-written rather than `hickory-server`: one question, two record
//! types, strict parsing of untrusted bytes, and no extra dependency tree.

use std::net::Ipv4Addr;

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_FORMERR: u8 = 1;
const RCODE_NXDOMAIN: u8 = 3;
const RCODE_REFUSED: u8 = 5;

#[derive(Debug, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    pub name: String,
    pub qtype: u16,
    /// The question section as received, echoed in the answer.
    question: Vec<u8>,
    rd: bool,
}

/// Parses a standard query with exactly one question. `Err(Some(reply))`
/// when the packet deserves a FORMERR, `Err(None)` when it deserves nothing.
pub fn parse(packet: &[u8]) -> Result<Query, Option<Vec<u8>>> {
    if packet.len() < 12 {
        return Err(None);
    }
    let id = u16::from_be_bytes([packet[0], packet[1]]);
    let flags = u16::from_be_bytes([packet[2], packet[3]]);
    let is_response = flags & 0x8000 != 0;
    let opcode = (flags >> 11) & 0xf;
    let qdcount = u16::from_be_bytes([packet[4], packet[5]]);
    if is_response {
        return Err(None);
    }
    let formerr = || Some(header(id, false, RCODE_FORMERR, &[], 0));
    if opcode != 0 || qdcount != 1 {
        return Err(formerr());
    }
    let mut pos = 12;
    let mut labels: Vec<String> = Vec::new();
    loop {
        let len = *packet.get(pos).ok_or_else(formerr)? as usize;
        pos += 1;
        if len == 0 {
            break;
        }
        // Compression pointers have no place in a question.
        if len > 63 {
            return Err(formerr());
        }
        let label = packet.get(pos..pos + len).ok_or_else(formerr)?;
        let label = std::str::from_utf8(label).map_err(|_| formerr())?;
        labels.push(label.to_ascii_lowercase());
        pos += len;
        if pos > 12 + 255 {
            return Err(formerr());
        }
    }
    let tail = packet.get(pos..pos + 4).ok_or_else(formerr)?;
    let qtype = u16::from_be_bytes([tail[0], tail[1]]);
    let qclass = u16::from_be_bytes([tail[2], tail[3]]);
    if qclass != CLASS_IN {
        return Err(Some(header(
            id,
            flags & 0x0100 != 0,
            RCODE_REFUSED,
            &packet[12..pos + 4],
            1,
        )));
    }
    Ok(Query {
        id,
        name: labels.join("."),
        qtype,
        question: packet[12..pos + 4].to_vec(),
        rd: flags & 0x0100 != 0,
    })
}

fn header(id: u16, rd: bool, rcode: u8, question: &[u8], qdcount: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + question.len() + 16);
    out.extend_from_slice(&id.to_be_bytes());
    // QR, RD echoed, RA, rcode
    let flags: u16 = 0x8000 | if rd { 0x0100 } else { 0 } | 0x0080 | rcode as u16;
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&qdcount.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(question);
    out
}

/// The answer to a query: `address` is the name's address when the policy
/// allows the name, `None` when it does not.
pub fn answer(q: &Query, address: Option<Ipv4Addr>) -> Vec<u8> {
    match (q.qtype, address) {
        (TYPE_A, Some(ip)) => {
            let mut out = header(q.id, q.rd, 0, &q.question, 1);
            out[6..8].copy_from_slice(&1u16.to_be_bytes()); // one answer
            out.extend_from_slice(&[0xc0, 12]); // the name, by pointer
            out.extend_from_slice(&TYPE_A.to_be_bytes());
            out.extend_from_slice(&CLASS_IN.to_be_bytes());
            out.extend_from_slice(&5u32.to_be_bytes()); // a short TTL
            out.extend_from_slice(&4u16.to_be_bytes());
            out.extend_from_slice(&ip.octets());
            out
        }
        (TYPE_AAAA, Some(_)) => header(q.id, q.rd, 0, &q.question, 1),
        (TYPE_A | TYPE_AAAA, None) => header(q.id, q.rd, RCODE_NXDOMAIN, &q.question, 1),
        _ => header(q.id, q.rd, RCODE_REFUSED, &q.question, 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut p = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.split('.') {
            p.push(l.len() as u8);
            p.extend_from_slice(l.as_bytes());
        }
        p.push(0);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&1u16.to_be_bytes());
        p
    }

    #[test]
    fn answers_allowed_names_only() {
        let q = parse(&query("Web.Test", TYPE_A)).expect("query");
        assert_eq!(q.name, "web.test");
        let a = answer(&q, Some(Ipv4Addr::new(127, 77, 0, 1)));
        assert_eq!(&a[a.len() - 4..], &[127, 77, 0, 1]);
        assert_eq!(a[3] & 0xf, 0);
        let nx = answer(&q, None);
        assert_eq!(nx[3] & 0xf, RCODE_NXDOMAIN);
        let txt = parse(&query("web.test", 16)).expect("query");
        assert_eq!(
            answer(&txt, Some(Ipv4Addr::LOCALHOST))[3] & 0xf,
            RCODE_REFUSED
        );
    }

    #[test]
    fn malformed_packets_never_panic() {
        let good = query("a.b.test", TYPE_A);
        for n in 0..good.len() {
            let _ = parse(&good[..n]);
        }
        let mut ptr = good.clone();
        ptr[12] = 0xc0;
        assert!(parse(&ptr).is_err());
    }
}
