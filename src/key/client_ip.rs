//! The client's address, grouped into networks: the peer address, or what trusted
//! proxies say the client was.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::request::Parts;
use http::{HeaderMap, StatusCode};
use ipnet::{IpNet, Ipv4Net};

use super::extractor::{KeyExtractor, KeyRejection};
use super::forwarding::{forwarded_hop, plain_hop, trim, ElementsRev};
use crate::subject::Subject;

/// How many hops of a forwarding chain are examined by default.
const DEFAULT_MAX_HOPS: usize = 16;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static FORWARDED_NAME: HeaderName = FORWARDED;

/// Which forwarding header trusted proxies write the client address into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`: the de facto standard.
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for="[2001:db8::1]:4711"` (RFC 7239): its `for=` values.
    Forwarded,
    /// `X-Real-IP: client` (nginx): one address, read with the `X-Forwarded-For` syntax.
    XRealIp,
}

impl ForwardedHeader {
    /// The header's name.
    pub fn name(self) -> &'static HeaderName {
        match self {
            Self::XForwardedFor => &X_FORWARDED_FOR,
            Self::Forwarded => &FORWARDED_NAME,
            Self::XRealIp => &X_REAL_IP,
        }
    }
}

/// Keys requests by client address: IPv4 per address, IPv6 per `/64` network.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use redlimit::key::{ClientIp, ForwardedHeader, KeyExtractor};
/// use redlimit::Subject;
///
/// // Behind a load balancer in 10.0.0.0/8 that appends to `X-Forwarded-For`.
/// let key = ClientIp::new()
///     .trust_proxies(["10.0.0.0/8".parse().unwrap()])
///     .forwarded_header(ForwardedHeader::XForwardedFor);
///
/// let (mut parts, ()) = Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7") // the client forged 6.6.6.6
///     .body(())
///     .unwrap()
///     .into_parts();
/// parts.extensions.insert(SocketAddr::from(([10, 1, 2, 3], 50123)));
/// assert_eq!(key.extract(&parts), Ok(Subject::new("ip=203.0.113.7")));
///
/// // The same headers straight from the internet count for nothing.
/// parts.extensions.insert(SocketAddr::from(([198, 51, 100, 1], 50123)));
/// assert_eq!(key.extract(&parts), Ok(Subject::new("ip=198.51.100.1")));
/// ```
///
/// # The peer address
///
/// Found in the request extensions, first of: axum's `ConnectInfo<SocketAddr>` (or its
/// `MockConnectInfo`; with the `axum` feature), tonic's `TcpConnectInfo` (with the
/// `tonic` feature; tonic's TLS connect info is not read), or a plain [`SocketAddr`].
/// With bare hyper, insert the `SocketAddr` from `accept()` into each request; in tests,
/// insert one by hand. Without any, the request is rejected with **403**, and a body
/// that starts `client address unavailable` and says how to fix the setup: serve axum
/// with `into_make_service_with_connect_info::<SocketAddr>()`, enable this crate's
/// `axum` or `tonic` feature when the build lacks it, or insert a `SocketAddr`. It is a
/// server setup fault, so it is also logged as a warning, at most once a second.
/// Restate it with [`KeyExtractorExt::reject_with`](super::combine::KeyExtractorExt::reject_with)
/// or fall back with [`or`](super::combine::KeyExtractorExt::or).
///
/// # Forwarding headers
///
/// Read only when the peer is inside a trusted proxy network
/// ([`ClientIp::trust_proxies`]); by default none is trusted and headers are ignored,
/// since anyone can write them. Trust only proxies that append (or set) the header
/// themselves. All lines of the header are read as one list, in order. The chain, with
/// the peer at its right end, is walked from the right:
///
/// - the first address that is not inside a trusted network is the client;
/// - every address passed so far was a trusted proxy, so when the walk cannot go on,
///   the client is the **last trusted address reached** (the left-most trusted hop, or
///   the peer itself). The walk cannot go on when the chain is used up (every hop is
///   trusted), when a hop is not an address (`unknown`, an obfuscated `_name`, a
///   missing `for=`, garbage, non-UTF-8 bytes), or after [`ClientIp::max_hops`] hops
///   (16 by default).
///
/// A client can only write to the left of the address its own proxy appends, and the
/// walk stops at that address first, so no header content (forged hops, garbage,
/// unbalanced quotes, megabytes of commas) moves the subject away from the address the
/// trusted proxy saw. Work is linear in the bytes walked and allocates nothing.
///
/// # Subjects
///
/// IPv4-mapped IPv6 addresses (`::ffff:203.0.113.7`) are IPv4. Addresses are grouped
/// into networks: IPv4 by `/32`, IPv6 by `/64` (one customer's allocation holds many
/// addresses), both configurable. The subject reads `ip=203.0.113.7`,
/// `ip=198.51.100.0/24` or `ip=2001:db8:1:2::/64`.
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    header: ForwardedHeader,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    max_hops: usize,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientIp {
    /// The peer address, no proxy trusted, IPv4 per `/32` and IPv6 per `/64`.
    pub fn new() -> Self {
        Self {
            trusted: Arc::from([]),
            header: ForwardedHeader::default(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            max_hops: DEFAULT_MAX_HOPS,
        }
    }

    /// Adds networks of proxies whose forwarding headers are believed.
    ///
    /// Networks written as IPv4-mapped IPv6 (`::ffff:10.0.0.0/104`) are taken as IPv4,
    /// as addresses are.
    pub fn trust_proxies(mut self, networks: impl IntoIterator<Item = IpNet>) -> Self {
        let mut all = self.trusted.to_vec();
        all.extend(networks.into_iter().map(canonical_net));
        self.trusted = all.into();
        self
    }

    /// Chooses the forwarding header trusted proxies write (`X-Forwarded-For` by default).
    pub fn forwarded_header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by this prefix length (64 by default; above 128 means 128).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Groups IPv4 clients by this prefix length (32 by default; above 32 means 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.ipv4_prefix = bits.min(32);
        self
    }

    /// Examines at most this many hops of a forwarding chain (16 by default).
    pub fn max_hops(mut self, hops: usize) -> Self {
        self.max_hops = hops;
        self
    }

    /// The client address: the peer, or what trusted proxies say (see the type docs).
    pub fn client_addr(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut last_trusted = peer.to_canonical();
        if !self.is_trusted(last_trusted) {
            return last_trusted;
        }
        let quoted = self.header == ForwardedHeader::Forwarded;
        let mut examined = 0;
        for line in headers.get_all(self.header.name()).iter().rev() {
            for element in ElementsRev::new(line.as_bytes(), quoted) {
                let element = trim(element);
                if element.is_empty() {
                    continue;
                }
                if examined == self.max_hops {
                    return last_trusted;
                }
                examined += 1;
                let hop = if quoted {
                    forwarded_hop(element)
                } else {
                    plain_hop(element)
                };
                match hop.map(|addr| addr.to_canonical()) {
                    Some(addr) if self.is_trusted(addr) => last_trusted = addr,
                    Some(addr) => return addr,
                    None => return last_trusted,
                }
            }
        }
        last_trusted
    }

    /// The subject of an address: its network under the configured prefix.
    pub fn subject_of(&self, addr: IpAddr) -> Subject {
        let mut text = IpText::default();
        text.push(b"ip=");
        match addr.to_canonical() {
            IpAddr::V4(v4) => {
                let network = u32::from(v4) & mask32(self.ipv4_prefix);
                for (i, octet) in network.to_be_bytes().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b".");
                    }
                    text.push_decimal(octet);
                }
                if self.ipv4_prefix < 32 {
                    text.push(b"/");
                    text.push_decimal(self.ipv4_prefix);
                }
            }
            IpAddr::V6(v6) => {
                let network = Ipv6Addr::from(u128::from(v6) & mask128(self.ipv6_prefix));
                // Cannot fail: the longest IPv6 text is 45 bytes.
                let _ = write!(text, "{network}");
                if self.ipv6_prefix < 128 {
                    text.push(b"/");
                    text.push_decimal(self.ipv6_prefix);
                }
            }
        }
        Subject::new(text.as_bytes())
    }

    fn is_trusted(&self, addr: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&addr))
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        match peer_addr(parts) {
            Some(peer) => Ok(self.subject_of(self.client_addr(peer.ip(), &parts.headers))),
            None => {
                let message = no_peer_message(cfg!(feature = "axum"), cfg!(feature = "tonic"));
                crate::telemetry::no_peer_address(message);
                Err(KeyRejection::new(StatusCode::FORBIDDEN, message))
            }
        }
    }
}

/// Why no peer address was found and how to fix it, for a build with or without the
/// `axum` and `tonic` features (the parts a build lacks are the likely cause).
fn no_peer_message(axum: bool, tonic: bool) -> &'static str {
    macro_rules! message {
        ($($cause:literal),*) => {
            concat!(
                "client address unavailable: no peer address in the request; ",
                $($cause,)*
                "or put a SocketAddr in the request's extensions"
            )
        };
    }
    match (axum, tonic) {
        (true, true) => message!(
            "serve axum with into_make_service_with_connect_info::<SocketAddr>() ",
            "(tonic's server gives it by itself), "
        ),
        (true, false) => message!(
            "serve axum with into_make_service_with_connect_info::<SocketAddr>(), ",
            "for tonic enable redlimit's `tonic` feature, "
        ),
        (false, true) => message!(
            "redlimit was built without its `axum` feature, so axum's ConnectInfo is not ",
            "read: for axum enable it and serve with ",
            "into_make_service_with_connect_info::<SocketAddr>(), "
        ),
        (false, false) => message!(
            "redlimit was built without its `axum` and `tonic` features, so neither axum's ",
            "ConnectInfo nor tonic's connect info is read: enable the one of your server ",
            "(axum: and serve with into_make_service_with_connect_info::<SocketAddr>()), "
        ),
    }
}

/// The peer address a server left in the request extensions.
fn peer_addr(parts: &Parts) -> Option<SocketAddr> {
    let ext = &parts.extensions;
    #[cfg(feature = "axum")]
    {
        use axum::extract::connect_info::{ConnectInfo, MockConnectInfo};
        if let Some(ConnectInfo(addr)) = ext.get::<ConnectInfo<SocketAddr>>() {
            return Some(*addr);
        }
        if let Some(MockConnectInfo(addr)) = ext.get::<MockConnectInfo<SocketAddr>>() {
            return Some(*addr);
        }
    }
    #[cfg(feature = "tonic")]
    {
        let info = ext.get::<tonic::transport::server::TcpConnectInfo>();
        if let Some(addr) = info.and_then(|info| info.remote_addr()) {
            return Some(addr);
        }
    }
    ext.get::<SocketAddr>().copied()
}

/// A network given in IPv4-mapped form, as the IPv4 network it is.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net {
        if let (Some(v4), true) = (v6.addr().to_ipv4_mapped(), v6.prefix_len() >= 96) {
            if let Ok(v4net) = Ipv4Net::new(v4, v6.prefix_len() - 96) {
                return IpNet::V4(v4net.trunc());
            }
        }
    }
    net.trunc()
}

/// An address subject's text, on the stack: `ip=`, at most 45 bytes of IPv6, `/128`.
struct IpText {
    buf: [u8; 64],
    len: usize,
}

impl Default for IpText {
    fn default() -> Self {
        Self {
            buf: [0; 64],
            len: 0,
        }
    }
}

impl IpText {
    /// Appends `bytes`, or nothing if they do not fit (they always do).
    fn push(&mut self, bytes: &[u8]) -> bool {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(room) => {
                room.copy_from_slice(bytes);
                self.len += bytes.len();
                true
            }
            None => false,
        }
    }

    /// Appends a number in decimal, without the formatting machinery.
    fn push_decimal(&mut self, n: u8) {
        let digits = [b'0' + n / 100, b'0' + n / 10 % 10, b'0' + n % 10];
        let skip = if n >= 100 {
            0
        } else if n >= 10 {
            1
        } else {
            2
        };
        self.push(&digits[skip..]);
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.push(s.as_bytes()) {
            Ok(())
        } else {
            Err(std::fmt::Error)
        }
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Request};
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    const PROXY_A: [u8; 4] = [10, 0, 0, 1];
    const PROXY_B: [u8; 4] = [10, 0, 0, 2];

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn trusting(header: ForwardedHeader) -> ClientIp {
        ClientIp::new()
            .trust_proxies([net("10.0.0.0/8"), net("fd00::/8")])
            .forwarded_header(header)
    }

    fn request(peer: impl Into<SocketAddr>, headers: &[(&str, &[u8])]) -> Parts {
        let (mut parts, ()) = Request::new(()).into_parts();
        for (name, value) in headers {
            parts.headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        parts.extensions.insert(peer.into());
        parts
    }

    fn peer(ip: [u8; 4]) -> SocketAddr {
        SocketAddr::from((ip, 4711))
    }

    fn ip(s: &str) -> Subject {
        Subject::new(format!("ip={s}"))
    }

    #[test]
    fn the_peer_address_without_trusted_proxies() {
        let key = ClientIp::new();
        let parts = request(peer([203, 0, 113, 7]), &[]);
        assert_eq!(key.extract(&parts), Ok(ip("203.0.113.7")));
    }

    #[test]
    fn forged_headers_from_an_untrusted_peer_change_nothing() {
        for header in [
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ] {
            let parts = request(
                peer([198, 51, 100, 9]),
                &[
                    ("x-forwarded-for", b"1.1.1.1, 10.0.0.1"),
                    ("forwarded", b"for=1.1.1.1, for=10.0.0.1"),
                    ("x-real-ip", b"1.1.1.1"),
                ],
            );
            // Not even the default "trust nothing" key, nor one trusting other proxies.
            assert_eq!(ClientIp::new().extract(&parts), Ok(ip("198.51.100.9")));
            assert_eq!(trusting(header).extract(&parts), Ok(ip("198.51.100.9")));
        }
    }

    #[test]
    fn trusted_proxies_are_honoured_right_to_left() {
        // client 203.0.113.7 -> proxy 10.0.0.1 -> proxy 10.0.0.2 -> us; the client
        // forged 6.6.6.6 and a trusted-looking 10.9.9.9 on the left.
        let cases: [(ForwardedHeader, &str, &[u8]); 3] = [
            (
                ForwardedHeader::XForwardedFor,
                "x-forwarded-for",
                b"6.6.6.6, 10.9.9.9, 203.0.113.7, 10.0.0.1",
            ),
            (
                ForwardedHeader::Forwarded,
                "forwarded",
                b"for=6.6.6.6, for=10.9.9.9, for=203.0.113.7;proto=https, for=10.0.0.1",
            ),
            (ForwardedHeader::XRealIp, "x-real-ip", b"203.0.113.7"),
        ];
        for (header, name, value) in cases {
            let parts = request(peer(PROXY_B), &[(name, value)]);
            assert_eq!(trusting(header).extract(&parts), Ok(ip("203.0.113.7")));
            // A header of another kind is not read.
            let other = match header {
                ForwardedHeader::XRealIp => ForwardedHeader::Forwarded,
                _ => ForwardedHeader::XRealIp,
            };
            assert_eq!(trusting(other).extract(&parts), Ok(ip("10.0.0.2")));
        }
    }

    #[test]
    fn several_header_lines_are_one_list_in_order() {
        let key = trusting(ForwardedHeader::XForwardedFor);
        let parts = request(
            peer(PROXY_B),
            &[
                ("x-forwarded-for", b"6.6.6.6"),
                ("x-forwarded-for", b"203.0.113.7, 10.0.0.5"),
                ("x-forwarded-for", b""),
                ("x-forwarded-for", b"10.0.0.1"),
            ],
        );
        assert_eq!(key.extract(&parts), Ok(ip("203.0.113.7")));

        let key = trusting(ForwardedHeader::Forwarded);
        let parts = request(
            peer(PROXY_B),
            &[
                ("forwarded", b"for=\"[2001:db8::7]:4711\""),
                ("forwarded", b"for=10.0.0.1;by=10.0.0.2"),
            ],
        );
        assert_eq!(key.extract(&parts), Ok(ip("2001:db8::/64")));
    }

    #[test]
    fn an_all_trusted_chain_gives_its_left_most_hop() {
        let key = trusting(ForwardedHeader::XForwardedFor);
        let parts = request(peer(PROXY_B), &[("x-forwarded-for", b"10.0.0.7, 10.0.0.1")]);
        assert_eq!(key.extract(&parts), Ok(ip("10.0.0.7")));
        // No header at all: the trusted peer itself.
        assert_eq!(
            key.extract(&request(peer(PROXY_A), &[])),
            Ok(ip("10.0.0.1"))
        );
    }

    #[test]
    fn a_hop_that_is_not_an_address_stops_at_the_last_trusted_one() {
        let key = trusting(ForwardedHeader::Forwarded);
        for value in [
            &b"for=203.0.113.7, for=unknown, for=10.0.0.1"[..],
            b"for=203.0.113.7, for=_hidden, for=10.0.0.1",
            b"for=203.0.113.7, proto=https, for=10.0.0.1",
            b"for=203.0.113.7, for=\xff\xfe, for=10.0.0.1",
            b"for=203.0.113.7, for=\"[::1, for=10.0.0.1",
        ] {
            let parts = request(peer(PROXY_B), &[("forwarded", value)]);
            assert_eq!(
                key.extract(&parts),
                Ok(ip("10.0.0.1")),
                "{}",
                String::from_utf8_lossy(value)
            );
        }
        let parts = request(peer(PROXY_B), &[("forwarded", b"for=unknown")]);
        assert_eq!(key.extract(&parts), Ok(ip("10.0.0.2")));
    }

    #[test]
    fn ports_and_brackets_are_read_in_every_header() {
        let xff = trusting(ForwardedHeader::XForwardedFor);
        for (value, expected) in [
            (&b"203.0.113.7:5555"[..], "203.0.113.7"),
            (b"[2001:db8:1:2::9]:443", "2001:db8:1:2::/64"),
            (b"[2001:db8:1:2::9]", "2001:db8:1:2::/64"),
            (b"2001:db8:1:2::9", "2001:db8:1:2::/64"),
            (b" \t203.0.113.7 ,, ", "203.0.113.7"),
        ] {
            let parts = request(peer(PROXY_A), &[("x-forwarded-for", value)]);
            assert_eq!(xff.extract(&parts), Ok(ip(expected)));
        }
        let real = trusting(ForwardedHeader::XRealIp);
        let parts = request(peer(PROXY_A), &[("x-real-ip", b"[2001:db8::1]:80")]);
        assert_eq!(real.extract(&parts), Ok(ip("2001:db8::/64")));
    }

    #[test]
    fn garbage_is_a_defined_outcome() {
        let key = trusting(ForwardedHeader::XForwardedFor);
        // A 64 KiB value of junk left of the appended address: the address wins.
        let mut huge = vec![b'x'; 64 * 1024];
        huge.extend_from_slice(b", 203.0.113.7");
        let parts = request(peer(PROXY_A), &[("x-forwarded-for", &huge)]);
        assert_eq!(key.extract(&parts), Ok(ip("203.0.113.7")));
        // A 64 KiB hop where the walk needs an address: the trusted peer.
        let parts = request(peer(PROXY_A), &[("x-forwarded-for", &huge[..64 * 1024])]);
        assert_eq!(key.extract(&parts), Ok(ip("10.0.0.1")));
        // 64 KiB of commas: nothing to read, the trusted peer.
        let parts = request(peer(PROXY_A), &[("x-forwarded-for", &[b','; 65536][..])]);
        assert_eq!(key.extract(&parts), Ok(ip("10.0.0.1")));
        // 1000 hops, all trusted: the walk stops after 16, at the last one examined.
        let chain: Vec<String> = (0..1000)
            .map(|i| format!("10.0.{}.{}", i / 250, i % 250))
            .collect();
        let chain = chain.join(", ");
        let parts = request(peer(PROXY_A), &[("x-forwarded-for", chain.as_bytes())]);
        assert_eq!(key.extract(&parts), Ok(ip("10.0.3.234")));
        assert_eq!(
            key.clone().max_hops(2000).extract(&parts),
            Ok(ip("10.0.0.0"))
        );
        assert_eq!(key.clone().max_hops(0).extract(&parts), Ok(ip("10.0.0.1")));
        // 1000 untrusted hops: the right-most one.
        let chain = vec!["192.0.2.1"; 1000].join(",");
        let parts = request(peer(PROXY_A), &[("x-forwarded-for", chain.as_bytes())]);
        assert_eq!(key.extract(&parts), Ok(ip("192.0.2.1")));
    }

    #[test]
    fn ipv6_is_grouped_by_prefix() {
        let key = ClientIp::new();
        let a = "2001:db8:1:2::1".parse::<IpAddr>().unwrap();
        let b = "2001:db8:1:2:ffff:ffff:ffff:ffff"
            .parse::<IpAddr>()
            .unwrap();
        let c = "2001:db8:1:3::1".parse::<IpAddr>().unwrap();
        assert_eq!(key.subject_of(a), ip("2001:db8:1:2::/64"));
        assert_eq!(key.subject_of(a), key.subject_of(b));
        assert_ne!(key.subject_of(a), key.subject_of(c));

        let wide = ClientIp::new().ipv6_prefix(56);
        assert_eq!(wide.subject_of(a), wide.subject_of(c));
        assert_eq!(wide.subject_of(a), ip("2001:db8:1::/56"));
        let exact = ClientIp::new().ipv6_prefix(200);
        assert_eq!(exact.subject_of(a), ip("2001:db8:1:2::1"));
        assert_ne!(exact.subject_of(a), exact.subject_of(b));
        assert_eq!(ClientIp::new().ipv6_prefix(0).subject_of(a), ip("::/0"));
    }

    #[test]
    fn ipv4_prefix_is_configurable() {
        let key = ClientIp::new().ipv4_prefix(24);
        let a = IpAddr::from([198, 51, 100, 7]);
        assert_eq!(key.subject_of(a), ip("198.51.100.0/24"));
        assert_eq!(
            key.subject_of(IpAddr::from([198, 51, 100, 250])),
            key.subject_of(a)
        );
        assert_eq!(
            ClientIp::new().ipv4_prefix(0).subject_of(a),
            ip("0.0.0.0/0")
        );
        assert_eq!(
            ClientIp::new().ipv4_prefix(99).subject_of(a),
            ip("198.51.100.7")
        );
    }

    #[test]
    fn ipv4_mapped_addresses_are_ipv4() {
        let mapped: SocketAddr = "[::ffff:203.0.113.7]:80".parse().unwrap();
        let key = ClientIp::new();
        assert_eq!(key.extract(&request(mapped, &[])), Ok(ip("203.0.113.7")));

        // A mapped proxy is trusted by its IPv4 network, and mapped hops are IPv4.
        let mapped_proxy: SocketAddr = "[::ffff:10.0.0.1]:80".parse().unwrap();
        let parts = request(mapped_proxy, &[("x-forwarded-for", b"::ffff:203.0.113.7")]);
        assert_eq!(
            trusting(ForwardedHeader::XForwardedFor).extract(&parts),
            Ok(ip("203.0.113.7"))
        );

        // A trusted network written in mapped form covers IPv4 peers.
        let key = ClientIp::new().trust_proxies([net("::ffff:10.0.0.0/104")]);
        let parts = request(peer(PROXY_A), &[("x-forwarded-for", b"203.0.113.7")]);
        assert_eq!(key.extract(&parts), Ok(ip("203.0.113.7")));
    }

    #[test]
    fn a_missing_peer_address_is_a_403_that_says_how_to_fix_it() {
        // Nothing in the extensions: the path every build has, features or not.
        let (parts, ()) = Request::new(()).into_parts();
        let err = ClientIp::new().extract(&parts).unwrap_err();
        assert_eq!(err.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            err.message(),
            no_peer_message(cfg!(feature = "axum"), cfg!(feature = "tonic"))
        );
        for (axum, tonic) in [(false, false), (false, true), (true, false), (true, true)] {
            let message = no_peer_message(axum, tonic);
            assert!(
                message.starts_with("client address unavailable: "),
                "{message}"
            );
            assert!(
                message.contains("into_make_service_with_connect_info::<SocketAddr>()"),
                "{message}"
            );
            assert!(message.contains("SocketAddr in the request's extensions"));
            // A build without a feature names the missing feature.
            assert_eq!(
                message.contains("`axum` feature") || message.contains("`axum` and"),
                !axum,
                "{message}"
            );
            assert_eq!(
                message.contains("`tonic` feature") || message.contains("`tonic` features"),
                !tonic,
                "{message}"
            );
            // Safe as a plain-text body and as a grpc-message.
            assert!(
                message.bytes().all(|b| (0x20..0x7f).contains(&b)),
                "{message}"
            );
        }
    }

    #[cfg(feature = "axum")]
    #[test]
    fn axum_connect_info_comes_first() {
        use axum::extract::connect_info::{ConnectInfo, MockConnectInfo};
        let mut parts = request(peer([192, 0, 2, 3]), &[]);
        parts
            .extensions
            .insert(MockConnectInfo(peer([192, 0, 2, 2])));
        assert_eq!(ClientIp::new().extract(&parts), Ok(ip("192.0.2.2")));
        parts.extensions.insert(ConnectInfo(peer([192, 0, 2, 1])));
        assert_eq!(ClientIp::new().extract(&parts), Ok(ip("192.0.2.1")));
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn tonic_connect_info_is_read() {
        use tonic::transport::server::TcpConnectInfo;
        let mut parts = request(peer([192, 0, 2, 3]), &[]);
        parts.extensions.insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(peer([192, 0, 2, 1])),
        });
        assert_eq!(ClientIp::new().extract(&parts), Ok(ip("192.0.2.1")));
        // Connect info without a remote address falls through to the plain one.
        parts.extensions.insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: None,
        });
        assert_eq!(ClientIp::new().extract(&parts), Ok(ip("192.0.2.3")));
    }

    /// Header bytes that a `HeaderValue` accepts, weighted towards the syntax that matters.
    fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            4 => prop::collection::vec(
                any::<u8>().prop_filter("valid header byte", |b| *b == b'\t' || (*b >= 0x20 && *b != 0x7f)),
                0..8,
            ),
            1 => prop::sample::select(vec![
                ",", ";", "\"", "\\", "[", "]", ":", "=", " ", "for=", "For=", "unknown", "_x",
                "10.0.0.1", "203.0.113.7", "::1", "::ffff:10.0.0.9", "[2001:db8::1]", ":80",
                "\\\"", "proto=http",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
        ];
        prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }

    fn all_headers(lines: &[Vec<u8>]) -> Vec<(&'static str, &[u8])> {
        let mut headers = Vec::new();
        for line in lines {
            for name in ["x-forwarded-for", "forwarded", "x-real-ip"] {
                headers.push((name, &line[..]));
            }
        }
        headers
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_header_bytes_never_panic(
            lines in prop::collection::vec(header_bytes(), 0..4),
            untrusted in any::<[u8; 4]>().prop_filter("outside 10/8", |ip| ip[0] != 10),
        ) {
            let headers = all_headers(&lines);
            for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded, ForwardedHeader::XRealIp] {
                let key = trusting(header);
                // An untrusted peer is always its own subject.
                let parts = request(peer(untrusted), &headers);
                prop_assert_eq!(key.extract(&parts), Ok(key.subject_of(IpAddr::from(untrusted))));
                // A trusted peer gives some address, never a panic or a rejection.
                let parts = request(peer(PROXY_A), &headers);
                prop_assert!(key.extract(&parts).is_ok());
            }
        }

        #[test]
        fn subjects_read_like_the_standard_address_text(
            v4 in any::<[u8; 4]>(),
            v6 in any::<u128>(),
            p4 in 0u8..=32,
            p6 in 0u8..=128,
        ) {
            let key = ClientIp::new().ipv4_prefix(p4).ipv6_prefix(p6);
            let v4 = Ipv4Addr::from(v4);
            let net4 = Ipv4Net::new(v4, p4).unwrap().trunc();
            let expected = if p4 == 32 { format!("ip={v4}") } else { format!("ip={net4}") };
            prop_assert_eq!(key.subject_of(IpAddr::V4(v4)), Subject::new(expected));
            let v6 = Ipv6Addr::from(v6);
            let subject = key.subject_of(IpAddr::V6(v6));
            if let Some(mapped) = v6.to_ipv4_mapped() {
                prop_assert_eq!(subject, key.subject_of(IpAddr::V4(mapped)));
            } else {
                let net6 = ipnet::Ipv6Net::new(v6, p6).unwrap().trunc();
                let expected = if p6 == 128 { format!("ip={v6}") } else { format!("ip={net6}") };
                prop_assert_eq!(subject, Subject::new(expected));
            }
        }

        #[test]
        fn garbage_left_of_the_appended_address_changes_nothing(
            garbage in header_bytes(),
            client in any::<[u8; 4]>().prop_filter("outside 10/8", |ip| ip[0] != 10),
        ) {
            let client = Ipv4Addr::from(client);
            for (header, name, appended) in [
                (ForwardedHeader::XForwardedFor, "x-forwarded-for", format!(", {client}")),
                (ForwardedHeader::Forwarded, "forwarded", format!(", for={client};proto=https")),
                (ForwardedHeader::Forwarded, "forwarded", format!(",for=\"{client}:443\"")),
            ] {
                let mut value = garbage.clone();
                value.extend_from_slice(appended.as_bytes());
                let parts = request(peer(PROXY_A), &[(name, &value)]);
                prop_assert_eq!(trusting(header).extract(&parts), Ok(ip(&client.to_string())));
                // Also when the proxy added its own line after the client's.
                let parts = request(peer(PROXY_A), &[(name, &garbage), (name, &appended.as_bytes()[1..])]);
                prop_assert_eq!(trusting(header).extract(&parts), Ok(ip(&client.to_string())));
            }
        }
    }
}
