//! Reading forwarding headers right to left, without allocating and without trusting
//! their syntax.
//!
//! The scanners here work on raw header bytes (non-UTF-8 bytes are just bytes) and walk
//! each header line from its end. That matters for safety, not only speed: a trusted
//! proxy appends its entry on the right, so scanning from the right reads that entry
//! first, whatever the client wrote to its left. A client's unbalanced quote or stray
//! bracket can spoil only elements that lie further left than the walk goes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest node text that can be an address with a port:
/// `[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:` plus an obfuscated port.
const MAX_NODE_LEN: usize = 96;

/// The elements of one comma-separated header line, from the right.
///
/// With `quoted`, commas inside RFC 7230 quoted strings (with `\"` escapes) do not
/// split; this is the `Forwarded` syntax. Empty elements are yielded as empty slices.
pub(super) struct ElementsRev<'a> {
    rest: Option<&'a [u8]>,
    quoted: bool,
}

impl<'a> ElementsRev<'a> {
    pub(super) fn new(line: &'a [u8], quoted: bool) -> Self {
        Self {
            rest: Some(line),
            quoted,
        }
    }
}

impl<'a> Iterator for ElementsRev<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        let mut in_quotes = false;
        let mut i = rest.len();
        while i > 0 {
            i -= 1;
            match rest[i] {
                b'"' if self.quoted && !(in_quotes && is_escaped(rest, i)) => {
                    in_quotes = !in_quotes;
                }
                b',' if !in_quotes => {
                    self.rest = Some(&rest[..i]);
                    return Some(&rest[i + 1..]);
                }
                _ => {}
            }
        }
        self.rest = None;
        Some(rest)
    }
}

/// Whether the byte at `at` is preceded by an odd run of backslashes.
fn is_escaped(bytes: &[u8], at: usize) -> bool {
    let run = bytes[..at]
        .iter()
        .rev()
        .take_while(|&&b| b == b'\\')
        .count();
    run % 2 == 1
}

/// Trims optional whitespace (spaces and tabs) from both ends.
pub(super) fn trim(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

/// The address in one `X-Forwarded-For` or `X-Real-IP` entry: `203.0.113.7`,
/// `2001:db8::1`, `[2001:db8::1]`, with or without a port. `None` for anything else.
pub(super) fn plain_hop(element: &[u8]) -> Option<IpAddr> {
    parse_node(element)
}

/// The address in one `Forwarded` element (RFC 7239): its first `for=` parameter,
/// quoted or not. `None` when there is no `for`, or it is `unknown`, an obfuscated
/// `_identifier`, or not an address.
pub(super) fn forwarded_hop(element: &[u8]) -> Option<IpAddr> {
    let mut start = 0;
    let mut in_quotes = false;
    let mut i = 0;
    while i <= element.len() {
        let end_of_pair = match element.get(i) {
            None => true,
            Some(b'"') => {
                if !(in_quotes && is_escaped(element, i)) {
                    in_quotes = !in_quotes;
                }
                false
            }
            Some(b';') => !in_quotes,
            Some(_) => false,
        };
        if end_of_pair {
            let pair = &element[start..i];
            if let Some(eq) = pair.iter().position(|&b| b == b'=') {
                if trim(&pair[..eq]).eq_ignore_ascii_case(b"for") {
                    return parse_node(unquote(trim(&pair[eq + 1..])));
                }
            }
            start = i + 1;
        }
        i += 1;
    }
    None
}

/// The inside of a quoted string; other values as they are.
fn unquote(value: &[u8]) -> &[u8] {
    match value {
        [b'"', inner @ .., b'"'] => inner,
        other => other,
    }
}

/// An address node, with an optional port (decimal or RFC 7239 `_obfuscated`).
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let node = trim(node);
    if node.len() > MAX_NODE_LEN {
        return None;
    }
    let text = std::str::from_utf8(node).ok()?;
    if let Some(bracketed) = text.strip_prefix('[') {
        let (inside, after) = bracketed.split_once(']')?;
        if !after.is_empty() && !after.strip_prefix(':').is_some_and(is_port) {
            return None;
        }
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(addr) = text.parse::<IpAddr>() {
        return Some(addr);
    }
    // Only IPv4 may carry a port without brackets: `2001:db8::1:80` is an address.
    let (host, port) = text.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// A decimal port or an RFC 7239 obfuscated port (`_` then `[A-Za-z0-9._-]`).
fn is_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obfuscated) => {
            !obfuscated.is_empty()
                && obfuscated
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        }
        None => !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(line: &str, quoted: bool) -> Vec<&str> {
        ElementsRev::new(line.as_bytes(), quoted)
            .map(|e| std::str::from_utf8(e).unwrap())
            .collect()
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn elements_come_from_the_right() {
        assert_eq!(rev("a, b,c", false), ["c", " b", "a"]);
        assert_eq!(rev("", false), [""]);
        assert_eq!(rev("a,", false), ["", "a"]);
        assert_eq!(rev(r#"for="x,y", for=z"#, true), [" for=z", r#"for="x,y""#]);
        assert_eq!(
            rev(r#"for="x,y", for=z"#, false),
            [" for=z", "y\"", "for=\"x"]
        );
        // An escaped quote inside a quoted string does not end it.
        assert_eq!(rev(r#"a="x\",y",b"#, true), ["b", r#"a="x\",y""#]);
        assert_eq!(rev(r#"a="x\\",y"#, true), ["y", r#"a="x\\""#]);
    }

    #[test]
    fn an_unbalanced_quote_on_the_left_spoils_only_the_left() {
        assert_eq!(
            rev(r#"for="oops, for=1.2.3.4, for=5.6.7.8"#, true),
            [" for=5.6.7.8", " for=1.2.3.4", "for=\"oops"]
        );
        assert_eq!(rev(r#"a, b"c, d"#, true), [" d", r#"a, b"c"#]);
    }

    #[test]
    fn trims_spaces_and_tabs_only() {
        assert_eq!(trim(b" \t a b\t "), b"a b");
        assert_eq!(trim(b"   "), b"");
        assert_eq!(trim(b"\na"), b"\na");
    }

    #[test]
    fn plain_hops() {
        assert_eq!(plain_hop(b"203.0.113.7"), ip("203.0.113.7"));
        assert_eq!(plain_hop(b" 203.0.113.7:8080 "), ip("203.0.113.7"));
        assert_eq!(plain_hop(b"2001:db8::1"), ip("2001:db8::1"));
        assert_eq!(plain_hop(b"2001:db8::1:80"), ip("2001:db8::1:80"));
        assert_eq!(plain_hop(b"[2001:db8::1]"), ip("2001:db8::1"));
        assert_eq!(plain_hop(b"[2001:db8::1]:443"), ip("2001:db8::1"));
        assert_eq!(plain_hop(b"::ffff:192.0.2.1"), ip("::ffff:192.0.2.1"));
        for bad in [
            &b"unknown"[..],
            b"",
            b"_hidden",
            b"203.0.113.7:",
            b"203.0.113.7:http",
            b"203.0.113.7:123456",
            b"[2001:db8::1",
            b"[2001:db8::1]x",
            b"[203.0.113.7]",
            b"2001:db8::1]:80",
            b"fe80::1%eth0",
            b"203.0.113.7\xff",
            b"\"203.0.113.7\"",
            b"example.com",
        ] {
            assert_eq!(plain_hop(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let long = format!("{}1.2.3.4", " ".repeat(200));
        assert_eq!(plain_hop(long.as_bytes()), ip("1.2.3.4"));
        assert_eq!(plain_hop("1".repeat(200).as_bytes()), None);
    }

    #[test]
    fn forwarded_syntax_variants() {
        let cases: &[(&str, Option<&str>)] = &[
            ("for=192.0.2.60", Some("192.0.2.60")),
            ("For=192.0.2.60", Some("192.0.2.60")),
            (" FOR = 192.0.2.60 ", Some("192.0.2.60")),
            ("for=\"192.0.2.60\"", Some("192.0.2.60")),
            (
                "for=192.0.2.60;proto=http;by=203.0.113.43",
                Some("192.0.2.60"),
            ),
            ("proto=https; for=192.0.2.60", Some("192.0.2.60")),
            ("for=\"192.0.2.60:8080\"", Some("192.0.2.60")),
            ("for=\"[2001:db8:cafe::17]\"", Some("2001:db8:cafe::17")),
            (
                "for=\"[2001:db8:cafe::17]:4711\"",
                Some("2001:db8:cafe::17"),
            ),
            (
                "for=\"[2001:db8:cafe::17]:_p0rt\"",
                Some("2001:db8:cafe::17"),
            ),
            ("for=[2001:db8:cafe::17]:4711", Some("2001:db8:cafe::17")),
            ("by=\"a;b\";for=192.0.2.60", Some("192.0.2.60")),
            ("for=192.0.2.60;for=198.51.100.1", Some("192.0.2.60")),
            ("for=unknown", None),
            ("for=\"unknown\"", None),
            ("for=_hidden", None),
            ("for=\"_SEVKISEK\"", None),
            ("proto=https", None),
            ("for", None),
            ("for=", None),
            ("for=\"", None),
            ("for=\"192.0.2.60", None),
            ("for=\"19\\2.0.2.60\"", None),
            ("foreign=192.0.2.60", None),
        ];
        for &(element, expected) in cases {
            assert_eq!(
                forwarded_hop(element.as_bytes()),
                expected.and_then(ip),
                "{element}"
            );
        }
    }
}
