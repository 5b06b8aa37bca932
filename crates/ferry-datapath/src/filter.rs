//! Packet filters in the language tcpdump users know: `tcp and port 80`,
//! `host 10.0.0.1 or net fd00::/64`, `not arp`. Used to choose the packets a live trace
//! or capture records; see `docs/filter.md` for the language.
//!
//! As in pcap filters, `and` and `or` have equal precedence and group from the left
//! (`a or b and c` is `(a or b) and c`), `not` binds tightest, and a bare value after
//! `and`/`or` takes the qualifiers of the primitive before it (`port 80 or 443`). A
//! protocol directly before `host`, `net`, `port`, `portrange`, `src` or `dst` qualifies
//! it (`tcp port 80` is `tcp and port 80`); any other juxtaposition is an error.
//!
//! A frame matches when its own headers do, or, for a VXLAN frame (UDP to the VXLAN
//! port), when the inner frame's do. ICMP errors match on their own headers only, never
//! on the packet they quote.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::flow::proto;
use crate::wire::ethernet::ethertype;
use crate::wire::{L3, Parsed, parse, vxlan};

/// Deepest nesting of `not`, parentheses and alternating `and`/`or` that a filter may
/// have: evaluation and display recurse that deep.
pub const MAX_DEPTH: usize = 64;

/// A protocol primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
    Icmp,
    Icmp6,
    Arp,
    Ip,
    Ip6,
}

impl Proto {
    fn from_word(w: &str) -> Option<Proto> {
        Some(match w {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            "icmp" => Proto::Icmp,
            "icmp6" => Proto::Icmp6,
            "arp" => Proto::Arp,
            "ip" => Proto::Ip,
            "ip6" => Proto::Ip6,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Icmp => "icmp",
            Proto::Icmp6 => "icmp6",
            Proto::Arp => "arp",
            Proto::Ip => "ip",
            Proto::Ip6 => "ip6",
        }
    }

    /// The address family the protocol implies, if any (true for IPv6).
    fn family_v6(self) -> Option<bool> {
        match self {
            Proto::Icmp | Proto::Arp | Proto::Ip => Some(false),
            Proto::Icmp6 | Proto::Ip6 => Some(true),
            Proto::Tcp | Proto::Udp => None,
        }
    }
}

/// Which address or port of a packet a primitive looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Either,
    Src,
    Dst,
}

impl Dir {
    fn prefix(self) -> &'static str {
        match self {
            Dir::Either => "",
            Dir::Src => "src ",
            Dir::Dst => "dst ",
        }
    }

    fn test<T: Copy>(self, src: Option<T>, dst: Option<T>, f: impl Fn(T) -> bool) -> bool {
        let src = || src.is_some_and(&f);
        let dst = || dst.is_some_and(&f);
        match self {
            Dir::Either => src() || dst(),
            Dir::Src => src(),
            Dir::Dst => dst(),
        }
    }
}

/// What a value is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Host,
    Net,
    Port,
    PortRange,
}

impl Kind {
    fn from_word(w: &str) -> Option<Kind> {
        Some(match w {
            "host" => Kind::Host,
            "net" => Kind::Net,
            "port" => Kind::Port,
            "portrange" => Kind::PortRange,
            _ => return None,
        })
    }
}

/// One test on a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Prim {
    Proto(Proto),
    Host(Dir, IpAddr),
    Net(Dir, IpNet),
    /// A TCP or UDP port in `lo..=hi`.
    Ports(Dir, u16, u16),
}

/// A filter expression; `and` and `or` chains are flattened.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expr {
    Prim(Prim),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

/// A parsed packet filter. The empty filter matches every frame.
///
/// ```
/// use ferry_datapath::CaptureFilter;
/// let m = CaptureFilter::parse("tcp port 80 or 443").unwrap();
/// assert_eq!(m.to_string(), "(tcp and port 80) or (tcp and port 443)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    expr: Option<Expr>,
    vxlan_port: u16,
}

impl Default for Match {
    fn default() -> Self {
        Match::all()
    }
}

impl Match {
    /// The filter that matches every frame (the empty expression).
    pub fn all() -> Match {
        Match {
            expr: None,
            vxlan_port: vxlan::PORT,
        }
    }

    /// Parses a filter expression (see the module documentation). Errors name the
    /// column (from 1) and the word where parsing stopped.
    pub fn parse(s: &str) -> Result<Match, String> {
        let toks = tokenize(s)?;
        let mut p = Parser {
            toks,
            next: 0,
            last: None,
        };
        let expr = if p.toks.is_empty() {
            None
        } else {
            let (e, _) = p.expr(0)?;
            if let Some(&(at, t)) = p.toks.get(p.next) {
                // expr() stops only at the end or at a `)` it did not open.
                return Err(at_column(
                    at,
                    format!("{} without a matching `(`", t.show()),
                ));
            }
            Some(e)
        };
        Ok(Match {
            expr,
            vxlan_port: vxlan::PORT,
        })
    }

    /// The same filter looking into VXLAN frames sent to UDP port `port` (the default
    /// is 4789, [`DEFAULT_VXLAN_PORT`](crate::DEFAULT_VXLAN_PORT)); 0 turns the look inside off.
    pub fn with_vxlan_port(mut self, port: u16) -> Match {
        self.vxlan_port = port;
        self
    }

    /// The UDP port of the VXLAN frames whose inner frame is matched too (0: none).
    pub fn vxlan_port(&self) -> u16 {
        self.vxlan_port
    }

    /// True for the empty filter, which matches everything.
    pub fn is_all(&self) -> bool {
        self.expr.is_none()
    }

    /// True when the Ethernet frame matches: its own headers, or those of the frame
    /// inside it when it is VXLAN. A frame the datapath cannot parse matches only on
    /// its EtherType: `ip`, `ip6` and `arp` can be true for it, every other primitive is
    /// false (so `not tcp` matches it). Never panics, whatever the bytes.
    pub fn matches(&self, frame: &[u8]) -> bool {
        let Some(e) = &self.expr else {
            return true;
        };
        let Ok(parsed) = parse(frame, 0) else {
            return e.eval(&Facts::unparsed(frame));
        };
        if e.eval(&Facts::of(frame, &parsed)) {
            return true;
        }
        let Some(inner) = vxlan_inner(frame, &parsed, self.vxlan_port) else {
            return false;
        };
        match parse(inner, 0) {
            Ok(p) => e.eval(&Facts::of(inner, &p)),
            Err(_) => e.eval(&Facts::unparsed(inner)),
        }
    }
}

/// The inner Ethernet frame of a VXLAN frame: an unfragmented UDP datagram to `port`
/// (not 0) with a valid VXLAN header; None for anything else.
pub fn vxlan_inner<'a>(frame: &'a [u8], parsed: &Parsed, port: u16) -> Option<&'a [u8]> {
    if port == 0
        || !parsed.is_ip()
        || parsed.proto != proto::UDP
        || !parsed.l4_complete
        || parsed.frag.is_some()
        || parsed.key.dst_port != port
    {
        return None;
    }
    vxlan::inner(frame, parsed).map(|(inner, _)| inner)
}

/// What the primitives look at in one frame.
struct Facts {
    l3: Option<L3>,
    /// The IP protocol, when the frame parsed as IP.
    proto: Option<u8>,
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    /// TCP or UDP ports, when the transport header is there.
    ports: Option<(u16, u16)>,
}

impl Facts {
    fn of(frame: &[u8], p: &Parsed) -> Facts {
        match p.l3 {
            L3::Arp => {
                // Sender and target protocol addresses (Ethernet/IPv4 ARP, checked by
                // the parser).
                let addr = |off: usize| {
                    let b: [u8; 4] = frame
                        .get(p.l3_off + off..p.l3_off + off + 4)?
                        .try_into()
                        .ok()?;
                    Some(IpAddr::from(b))
                };
                Facts {
                    l3: Some(L3::Arp),
                    proto: None,
                    src: addr(14),
                    dst: addr(24),
                    ports: None,
                }
            }
            l3 => Facts {
                l3: Some(l3),
                proto: Some(p.proto),
                src: Some(p.key.src.ip()),
                dst: Some(p.key.dst.ip()),
                ports: (matches!(p.proto, proto::TCP | proto::UDP) && p.l4_complete)
                    .then_some((p.key.src_port, p.key.dst_port)),
            },
        }
    }

    /// A frame that did not parse: its EtherType (after one VLAN tag) only.
    fn unparsed(frame: &[u8]) -> Facts {
        let etype = |off: usize| {
            frame
                .get(off..off + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
        };
        let mut t = etype(12);
        if matches!(t, Some(ethertype::VLAN | ethertype::QINQ)) {
            t = etype(16);
        }
        Facts {
            l3: match t {
                Some(ethertype::IPV4) => Some(L3::Ipv4),
                Some(ethertype::IPV6) => Some(L3::Ipv6),
                Some(ethertype::ARP) => Some(L3::Arp),
                _ => None,
            },
            proto: None,
            src: None,
            dst: None,
            ports: None,
        }
    }
}

impl Expr {
    fn eval(&self, f: &Facts) -> bool {
        match self {
            Expr::Prim(p) => p.eval(f),
            Expr::Not(e) => !e.eval(f),
            Expr::And(v) => v.iter().all(|e| e.eval(f)),
            Expr::Or(v) => v.iter().any(|e| e.eval(f)),
        }
    }
}

impl Prim {
    fn eval(&self, f: &Facts) -> bool {
        match *self {
            Prim::Proto(p) => {
                let ip = |l3: L3, n: u8| f.l3 == Some(l3) && f.proto == Some(n);
                match p {
                    Proto::Tcp => f.proto == Some(proto::TCP),
                    Proto::Udp => f.proto == Some(proto::UDP),
                    Proto::Icmp => ip(L3::Ipv4, proto::ICMP),
                    Proto::Icmp6 => ip(L3::Ipv6, proto::ICMPV6),
                    Proto::Arp => f.l3 == Some(L3::Arp),
                    Proto::Ip => f.l3 == Some(L3::Ipv4),
                    Proto::Ip6 => f.l3 == Some(L3::Ipv6),
                }
            }
            Prim::Host(d, a) => d.test(f.src, f.dst, |x| x == a),
            Prim::Net(d, n) => d.test(f.src, f.dst, |x| n.contains(&x)),
            Prim::Ports(d, lo, hi) => {
                let (s, t) = f.ports.unzip();
                d.test(s, t, |x| (lo..=hi).contains(&x))
            }
        }
    }
}

impl fmt::Display for Prim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prim::Proto(p) => f.write_str(p.name()),
            Prim::Host(d, a) => write!(f, "{}host {a}", d.prefix()),
            Prim::Net(d, n) => write!(f, "{}net {n}", d.prefix()),
            Prim::Ports(d, lo, hi) if lo == hi => write!(f, "{}port {lo}", d.prefix()),
            Prim::Ports(d, lo, hi) => write!(f, "{}portrange {lo}-{hi}", d.prefix()),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Parenthesised: any operand that is itself an `and` or `or` (of the other kind,
        // since chains are flattened), so that the text reads back as the same tree.
        let operand = |e: &Expr, f: &mut fmt::Formatter<'_>| match e {
            Expr::And(_) | Expr::Or(_) => write!(f, "({e})"),
            _ => write!(f, "{e}"),
        };
        let chain = |v: &[Expr], op: &str, f: &mut fmt::Formatter<'_>| {
            for (i, e) in v.iter().enumerate() {
                if i > 0 {
                    write!(f, " {op} ")?;
                }
                operand(e, f)?;
            }
            Ok(())
        };
        match self {
            Expr::Prim(p) => write!(f, "{p}"),
            Expr::Not(e) => {
                f.write_str("not ")?;
                operand(e, f)
            }
            Expr::And(v) => chain(v, "and", f),
            Expr::Or(v) => chain(v, "or", f),
        }
    }
}

/// The normalised expression: keywords spelled out (`and`, `or`, `not`), qualifiers
/// spelled out on every primitive, parentheses wherever `and` and `or` meet. The empty
/// filter displays as the empty string. Parsing the text gives the same filter.
impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.expr {
            Some(e) => write!(f, "{e}"),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok<'a> {
    LParen,
    RParen,
    Not,
    And,
    Or,
    Word(&'a str),
}

impl Tok<'_> {
    fn show(&self) -> String {
        match self {
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::Not => "`not`".into(),
            Tok::And => "`and`".into(),
            Tok::Or => "`or`".into(),
            Tok::Word(w) => format!("`{w}`"),
        }
    }
}

fn at_column(byte: usize, msg: String) -> String {
    format!("column {}: {msg}", byte + 1)
}

/// Splits a filter into tokens with their byte offsets.
fn tokenize(s: &str) -> Result<Vec<(usize, Tok<'_>)>, String> {
    let mut toks = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let (tok, len) = match c {
            _ if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            b'(' => (Tok::LParen, 1),
            b')' => (Tok::RParen, 1),
            b'!' => (Tok::Not, 1),
            b'&' | b'|' => {
                if b.get(i + 1) != Some(&c) {
                    let op = if c == b'&' { "&&" } else { "||" };
                    return Err(at_column(i, format!("`{}` alone: write `{op}`", c as char)));
                }
                (if c == b'&' { Tok::And } else { Tok::Or }, 2)
            }
            _ => {
                let len = b[i..]
                    .iter()
                    .position(|&c| c.is_ascii_whitespace() || b"()!&|".contains(&c))
                    .unwrap_or(b.len() - i);
                // The delimiters are ASCII: `i` and `i + len` are character boundaries.
                let w = &s[i..i + len];
                let tok = match w {
                    "and" => Tok::And,
                    "or" => Tok::Or,
                    "not" => Tok::Not,
                    w => Tok::Word(w),
                };
                (tok, len)
            }
        };
        toks.push((i, tok));
        i += len;
    }
    Ok(toks)
}

/// The qualifiers of the last primitive with a value, which a bare value after it
/// takes (`port 80 or 443`).
#[derive(Clone, Copy)]
struct Qual {
    proto: Option<Proto>,
    dir: Dir,
    kind: Kind,
}

struct Parser<'a> {
    toks: Vec<(usize, Tok<'a>)>,
    next: usize,
    last: Option<Qual>,
}

type Node = Result<(Expr, usize), String>;

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<(usize, Tok<'a>)> {
        self.toks.get(self.next).copied()
    }

    fn bump(&mut self) -> Option<(usize, Tok<'a>)> {
        let t = self.peek();
        self.next += usize::from(t.is_some());
        t
    }

    fn err_here(&self, msg: &str) -> String {
        match self.peek() {
            Some((at, t)) => at_column(at, format!("{msg}, found {}", t.show())),
            None => format!("at the end: {msg}"),
        }
    }

    /// `unary { (and | or) unary }`, grouping from the left. Returns the expression and
    /// its depth.
    fn expr(&mut self, depth: usize) -> Node {
        let (mut left, mut d) = self.unary(depth)?;
        loop {
            let and = match self.peek() {
                Some((_, Tok::And)) => true,
                Some((_, Tok::Or)) => false,
                None | Some((_, Tok::RParen)) => return Ok((left, d)),
                Some(_) => {
                    return Err(self.err_here("expected `and` or `or` between two primitives"));
                }
            };
            self.bump();
            let (right, rd) = self.unary(depth)?;
            (left, d) = join(left, d, right, rd, and);
            if d > MAX_DEPTH {
                return Err(self.err_here(&format!("nested deeper than {MAX_DEPTH}")));
            }
        }
    }

    fn unary(&mut self, depth: usize) -> Node {
        if depth >= MAX_DEPTH {
            return Err(self.err_here(&format!("nested deeper than {MAX_DEPTH}")));
        }
        let Some((at, t)) = self.bump() else {
            return Err(self.err_here("expected a primitive"));
        };
        match t {
            Tok::Not => {
                let (e, d) = self.unary(depth + 1)?;
                Ok((Expr::Not(Box::new(e)), d + 1))
            }
            Tok::LParen => {
                let r = self.expr(depth + 1)?;
                match self.bump() {
                    Some((_, Tok::RParen)) => Ok(r),
                    _ => Err(at_column(at, "`(` without a matching `)`".into())),
                }
            }
            Tok::Word(w) => self.primitive(at, w),
            Tok::RParen | Tok::And | Tok::Or => {
                self.next -= 1;
                Err(self.err_here("expected a primitive"))
            }
        }
    }

    /// A primitive starting with word `w` at byte `at` (already consumed).
    fn primitive(&mut self, at: usize, w: &'a str) -> Node {
        if let Some(p) = Proto::from_word(w) {
            let Some((at, Tok::Word(q))) = self.peek() else {
                return Ok((Expr::Prim(Prim::Proto(p)), 1));
            };
            if !is_qualifier(q) {
                return Ok((Expr::Prim(Prim::Proto(p)), 1));
            }
            self.bump();
            return self.qualified(Some(p), at, q);
        }
        if is_qualifier(w) {
            return self.qualified(None, at, w);
        }
        // A bare value: the last primitive's qualifiers, else a host or a net.
        let q = match self.last {
            Some(q) => q,
            None if w.parse::<IpAddr>().is_ok() => Qual {
                proto: None,
                dir: Dir::Either,
                kind: Kind::Host,
            },
            None if w.contains('/') => Qual {
                proto: None,
                dir: Dir::Either,
                kind: Kind::Net,
            },
            None if w.parse::<u32>().is_ok() => {
                return Err(at_column(
                    at,
                    format!("`{w}`: a number needs a qualifier, as in `port {w}`"),
                ));
            }
            None => return Err(at_column(at, format!("unknown primitive `{w}`"))),
        };
        self.value(q, at, w)
    }

    /// `[src|dst] [host|net|port|portrange] VALUE`, starting with word `w` at `at`
    /// (already consumed), after protocol `proto` if one was given.
    fn qualified(&mut self, proto: Option<Proto>, at: usize, w: &'a str) -> Node {
        let (dir, mut kind) = match w {
            "src" => (Dir::Src, None),
            "dst" => (Dir::Dst, None),
            w => (Dir::Either, Kind::from_word(w)),
        };
        if kind.is_none()
            && let Some((_, Tok::Word(k))) = self.peek()
            && let Some(k) = Kind::from_word(k)
        {
            self.bump();
            kind = Some(k);
        }
        let what = match kind {
            Some(Kind::Host) => "an address",
            Some(Kind::Net) => "a prefix such as 10.0.0.0/8",
            Some(Kind::Port) => "a port number",
            Some(Kind::PortRange) => "a port range such as 8000-8080",
            None => "an address, or host, net, port or portrange",
        };
        let Some((vat, Tok::Word(v))) = self.peek() else {
            return Err(self.err_here(&format!("`{w}` expects {what}")));
        };
        if is_qualifier(v) || Proto::from_word(v).is_some() {
            return Err(self.err_here(&format!("`{w}` expects {what}")));
        }
        self.bump();
        let kind = match kind {
            Some(k) => k,
            None if v.contains('/') => Kind::Net,
            None if v.parse::<IpAddr>().is_ok() => Kind::Host,
            None => {
                return Err(at_column(vat, format!("`{w}` expects {what}, found `{v}`")));
            }
        };
        let q = Qual { proto, dir, kind };
        if let (Some(p), Kind::Port | Kind::PortRange) = (proto, kind)
            && !matches!(p, Proto::Tcp | Proto::Udp)
        {
            return Err(at_column(
                at,
                format!("ports apply to tcp and udp, not to {}", p.name()),
            ));
        }
        self.value(q, vat, v)
    }

    /// The primitive for value `v` (at `at`) with qualifiers `q`, which become the last.
    fn value(&mut self, q: Qual, at: usize, v: &str) -> Node {
        let bad = |what: &str| at_column(at, format!("`{v}` is not {what}"));
        let family = |a: &IpAddr| match q.proto.and_then(Proto::family_v6) {
            Some(v6) if v6 != a.is_ipv6() => Err(at_column(
                at,
                format!(
                    "`{v}` is not an address of {}",
                    q.proto.map_or("", Proto::name)
                ),
            )),
            _ => Ok(()),
        };
        let prim = match q.kind {
            Kind::Host => {
                if v.contains('/') {
                    return Err(at_column(at, format!("`{v}` is a prefix: write `net {v}`")));
                }
                let a: IpAddr = v.parse().map_err(|_| bad("an IP address"))?;
                family(&a)?;
                Prim::Host(q.dir, a)
            }
            Kind::Net => {
                let n: IpNet = match v.parse::<IpNet>() {
                    Ok(n) => n,
                    Err(_) => v
                        .parse::<IpAddr>()
                        .map(IpNet::from)
                        .map_err(|_| bad("a prefix such as 10.0.0.0/8"))?,
                };
                if n.trunc() != n {
                    return Err(at_column(
                        at,
                        format!("`{v}` has host bits set: the network is {}", n.trunc()),
                    ));
                }
                family(&n.addr())?;
                Prim::Net(q.dir, n)
            }
            Kind::Port => {
                let p: u16 = v.parse().map_err(|_| bad("a port number (0-65535)"))?;
                Prim::Ports(q.dir, p, p)
            }
            Kind::PortRange => {
                let (lo, hi) = v
                    .split_once('-')
                    .and_then(|(a, b)| Some((a.parse::<u16>().ok()?, b.parse::<u16>().ok()?)))
                    .ok_or_else(|| bad("a port range such as 8000-8080"))?;
                if lo > hi {
                    return Err(at_column(at, format!("`{v}`: the range is empty")));
                }
                Prim::Ports(q.dir, lo, hi)
            }
        };
        self.last = Some(q);
        Ok(match q.proto {
            Some(p) => (
                Expr::And(vec![Expr::Prim(Prim::Proto(p)), Expr::Prim(prim)]),
                2,
            ),
            None => (Expr::Prim(prim), 1),
        })
    }
}

fn is_qualifier(w: &str) -> bool {
    matches!(w, "src" | "dst") || Kind::from_word(w).is_some()
}

/// `left and right` (or `or`), flattening chains of the same operator; depths are those
/// of the trees.
fn join(left: Expr, ld: usize, right: Expr, rd: usize, and: bool) -> (Expr, usize) {
    let mut v = match (left, and) {
        (Expr::And(v), true) | (Expr::Or(v), false) => v,
        (l, _) => vec![l],
    };
    let ld = if v.len() > 1 { ld - 1 } else { ld };
    let rd = match (right, and) {
        (Expr::And(r), true) | (Expr::Or(r), false) => {
            v.extend(r);
            rd - 1
        }
        (r, _) => {
            v.push(r);
            rd
        }
    };
    let e = if and { Expr::And(v) } else { Expr::Or(v) };
    (e, ld.max(rd) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::icmp::{ErrorKind, build_error};
    use crate::overlay::{Outer, encapsulate};
    use crate::wire::build::{self, IpOpts};
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn m(s: &str) -> Match {
        Match::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn udp(src: &str, dst: &str, sport: u16, dport: u16) -> Vec<u8> {
        build::udp(ip(src), ip(dst), sport, dport, b"data", &IpOpts::default())
    }

    fn tcp(src: &str, dst: &str, sport: u16, dport: u16) -> Vec<u8> {
        build::tcp(
            ip(src),
            ip(dst),
            sport,
            dport,
            1,
            0,
            build::tcp_flags::SYN,
            b"",
            &IpOpts::default(),
        )
    }

    fn arp(spa: [u8; 4], tpa: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&build::MAC_SRC);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&build::MAC_SRC);
        f.extend_from_slice(&spa);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&tpa);
        f
    }

    fn vxlan(inner: &[u8], port: u16) -> Vec<u8> {
        encapsulate(
            inner,
            &Outer {
                src_mac: build::MAC_SRC,
                dst_mac: build::MAC_DST,
                src: ip("192.168.0.1"),
                dst: ip("192.168.0.2"),
                vni: 7,
                port,
                hash: 0x1234,
                id: 0,
            },
        )
    }

    #[test]
    fn test_parse_normalises() {
        let cases = [
            ("", ""),
            ("tcp", "tcp"),
            ("tcp && port 80", "tcp and port 80"),
            ("tcp port 80", "tcp and port 80"),
            ("!arp", "not arp"),
            ("src 10.0.0.1", "src host 10.0.0.1"),
            ("dst fd00::/64", "dst net fd00::/64"),
            ("10.0.0.1", "host 10.0.0.1"),
            ("net 10.1.2.3", "net 10.1.2.3/32"),
            ("portrange 80-80", "port 80"),
            (
                "udp dst portrange 8000-8080",
                "udp and dst portrange 8000-8080",
            ),
            ("port 80 or 443", "port 80 or port 443"),
            (
                "tcp port 80 or 443",
                "(tcp and port 80) or (tcp and port 443)",
            ),
            (
                "host 10.0.0.1 and not 10.0.0.2",
                "host 10.0.0.1 and not host 10.0.0.2",
            ),
            // pcap's precedence: `and` and `or` equal, from the left.
            ("tcp or udp and port 53", "(tcp or udp) and port 53"),
            ("tcp or (udp and port 53)", "tcp or (udp and port 53)"),
        ];
        for (input, want) in cases {
            let got = m(input);
            assert_eq!(got.to_string(), want, "{input:?}");
            assert_eq!(m(&got.to_string()), got, "{input:?} reads back");
        }
        assert!(m("").is_all() && m("  ").is_all());
        assert!(!m("ip").is_all());
    }

    #[test]
    fn test_parse_errors_name_the_place() {
        let cases = [
            (
                "tcp udp",
                "column 5: expected `and` or `or` between two primitives, found `udp`",
            ),
            ("host 10.0.0.1 port 80", "column 15: expected `and` or `or`"),
            ("porrt 80", "column 1: unknown primitive `porrt`"),
            ("port", "at the end: `port` expects a port number"),
            ("port 70000", "column 6: `70000` is not a port number"),
            (
                "host 10.0.0.0/8",
                "column 6: `10.0.0.0/8` is a prefix: write `net 10.0.0.0/8`",
            ),
            ("net 10.0.0.1/8", "host bits set: the network is 10.0.0.0/8"),
            ("host example.com", "`example.com` is not an IP address"),
            ("ip6 host 10.0.0.1", "`10.0.0.1` is not an address of ip6"),
            ("icmp port 1", "ports apply to tcp and udp, not to icmp"),
            ("portrange 9-1", "the range is empty"),
            ("(tcp", "column 1: `(` without a matching `)`"),
            ("tcp)", "column 4: `)` without a matching `(`"),
            ("tcp and", "at the end: expected a primitive"),
            ("and tcp", "column 1: expected a primitive, found `and`"),
            ("tcp & udp", "column 5: `&` alone: write `&&`"),
            ("80", "a number needs a qualifier, as in `port 80`"),
            (
                "src tcp",
                "`src` expects an address, or host, net, port or portrange, found `tcp`",
            ),
        ];
        for (input, want) in cases {
            let e = Match::parse(input).unwrap_err();
            assert!(e.contains(want), "{input:?}: {e:?} should contain {want:?}");
        }
        let deep = format!("{}tcp{}", "(".repeat(100), ")".repeat(100));
        assert!(
            Match::parse(&deep)
                .unwrap_err()
                .contains("nested deeper than")
        );
        let nots = format!("{}tcp", "! ".repeat(100));
        assert!(
            Match::parse(&nots)
                .unwrap_err()
                .contains("nested deeper than")
        );
        let alternating = (0..100)
            .map(|i| format!("port {i}"))
            .collect::<Vec<_>>()
            .join(" and tcp or ");
        assert!(
            Match::parse(&alternating)
                .unwrap_err()
                .contains("nested deeper than")
        );
        // A long chain of one operator is flat.
        let chain = (0..1000)
            .map(|i| format!("port {i}"))
            .collect::<Vec<_>>()
            .join(" or ");
        assert!(m(&chain).matches(&udp("10.0.0.1", "10.0.0.2", 5000, 999)));
    }

    #[test]
    fn test_protocols() {
        let u4 = udp("10.0.0.1", "10.0.0.2", 1000, 53);
        let t6 = tcp("fd00::1", "fd00::2", 40000, 80);
        let echo4 = build::echo_request(
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            1,
            1,
            b"",
            &IpOpts::default(),
        );
        let echo6 =
            build::echo_request(ip("fd00::1"), ip("fd00::2"), 1, 1, b"", &IpOpts::default());
        let a = arp([10, 0, 0, 1], [10, 0, 0, 2]);
        let table: [(&str, [bool; 5]); 7] = [
            ("udp", [true, false, false, false, false]),
            ("tcp", [false, true, false, false, false]),
            ("icmp", [false, false, true, false, false]),
            ("icmp6", [false, false, false, true, false]),
            ("arp", [false, false, false, false, true]),
            ("ip", [true, false, true, false, false]),
            ("ip6", [false, true, false, true, false]),
        ];
        for (f, want) in table {
            let got = [&u4, &t6, &echo4, &echo6, &a].map(|fr| m(f).matches(fr));
            assert_eq!(got, want, "{f}");
        }
        assert!(m("").matches(&a) && m("").matches(b"junk"));
    }

    #[test]
    fn test_hosts_nets_and_ports() {
        let f = udp("10.0.0.1", "10.0.1.2", 1000, 53);
        for yes in [
            "host 10.0.0.1",
            "host 10.0.1.2",
            "src 10.0.0.1",
            "dst host 10.0.1.2",
            "net 10.0.0.0/16",
            "src net 10.0.0.0/24",
            "dst net 10.0.1.0/24",
            "port 53",
            "port 1000",
            "src port 1000",
            "dst port 53",
            "portrange 50-60",
            "udp port 53 and not tcp",
            "host 10.9.9.9 or 10.0.0.1",
        ] {
            assert!(m(yes).matches(&f), "{yes}");
        }
        for no in [
            "host 10.0.0.3",
            "dst 10.0.0.1",
            "src net 10.0.1.0/24",
            "host fd00::1",
            "net ::/0",
            "dst port 1000",
            "portrange 1-52",
            "tcp port 53",
            "not udp",
        ] {
            assert!(!m(no).matches(&f), "{no}");
        }
        // ICMP identifiers and types are not ports.
        let echo = build::echo_request(
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            80,
            1,
            b"",
            &IpOpts::default(),
        );
        assert!(!m("port 80").matches(&echo) && !m("port 2048").matches(&echo));
        // ARP: its sender and target addresses are the hosts; it has no ports.
        let a = arp([10, 0, 0, 1], [10, 0, 0, 2]);
        assert!(m("arp and src 10.0.0.1 and dst 10.0.0.2").matches(&a));
        assert!(m("net 10.0.0.0/30").matches(&a));
        assert!(!m("host 10.0.0.3").matches(&a) && !m("port 0").matches(&a));
    }

    #[test]
    fn test_later_fragments_have_no_ports() {
        let f = udp("10.0.0.1", "10.0.0.2", 1000, 53);
        let mut later = f.clone();
        later[14 + 6] = 0x00;
        later[14 + 7] = 0x01; // offset 8 bytes
        crate::wire::checksum::set_ipv4_header(&mut later[14..34]);
        assert!(m("udp and host 10.0.0.1").matches(&later));
        assert!(!m("port 53").matches(&later));
    }

    #[test]
    fn test_icmp_error_matches_on_its_own_headers() {
        let orig = tcp("10.0.0.1", "10.0.1.2", 40000, 80);
        let p = parse(&orig, 0).unwrap();
        let err = build_error(
            &orig,
            &p,
            ErrorKind::Unreachable { code: 3 },
            ip("10.0.9.9"),
            build::MAC_DST,
        )
        .unwrap();
        assert!(m("icmp and src 10.0.9.9 and dst 10.0.0.1").matches(&err));
        assert!(!m("tcp").matches(&err) && !m("port 80").matches(&err));
        assert!(!m("host 10.0.1.2").matches(&err));
    }

    #[test]
    fn test_vxlan_matches_outer_or_inner() {
        let inner = tcp("10.244.1.5", "10.244.2.7", 40000, 8080);
        let f = vxlan(&inner, vxlan::PORT);
        for yes in [
            "udp port 4789",
            "host 192.168.0.2",
            "tcp port 8080",
            "host 10.244.2.7",
        ] {
            assert!(m(yes).matches(&f), "{yes}");
        }
        // The whole expression holds on one of the two: the outer is not TCP, the inner
        // is not from 192.168.0.1.
        assert!(!m("tcp and src 192.168.0.1").matches(&f));
        assert!(!m("port 53").matches(&f));
        // Another port: only when told.
        let g = vxlan(&inner, 8472);
        assert!(!m("port 8080").matches(&g));
        assert!(m("port 8080").with_vxlan_port(8472).matches(&g));
        assert!(!m("port 8080").with_vxlan_port(0).matches(&f));
        assert_eq!(m("tcp").with_vxlan_port(8472).vxlan_port(), 8472);
    }

    #[test]
    fn test_unparsed_frames_match_on_their_ethertype() {
        let mut bad = udp("10.0.0.1", "10.0.0.2", 1, 2);
        bad[24] ^= 0xff; // the header checksum
        assert!(parse(&bad, 0).is_err());
        assert!(m("ip").matches(&bad) && m("not tcp").matches(&bad));
        assert!(!m("udp").matches(&bad) && !m("host 10.0.0.1").matches(&bad));
        assert!(!m("ip").matches(&bad[..13]) && m("not ip").matches(b""));
    }

    /// Words and symbols of the language, to build near-valid filters from.
    fn word() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "tcp",
            "udp",
            "icmp",
            "icmp6",
            "arp",
            "ip",
            "ip6",
            "host",
            "net",
            "port",
            "portrange",
            "src",
            "dst",
            "and",
            "or",
            "not",
            "&&",
            "||",
            "!",
            "(",
            ")",
            "&",
            "|",
            "10.0.0.1",
            "10.0.0.0/8",
            "fd00::1",
            "fd00::/64",
            "80",
            "1-2",
            "70000",
            "x",
            "",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn prop_parse_never_panics(s in ".{0,80}") {
            let _ = Match::parse(&s);
        }

        #[test]
        fn prop_parse_of_words_never_panics_and_reads_back(
            words in prop::collection::vec(word(), 0..16),
        ) {
            if let Ok(f) = Match::parse(&words.join(" ")) {
                prop_assert_eq!(Match::parse(&f.to_string()), Ok(f));
            }
        }

        #[test]
        fn prop_matches_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..200),
            flips in prop::collection::vec((0usize..120, any::<u8>()), 0..4),
        ) {
            let f = m("tcp port 8080 or (arp and host 10.0.0.1) or not net fd00::/8");
            let _ = f.matches(&bytes);
            let mut v = vxlan(&tcp("10.0.0.1", "10.0.0.2", 1, 8080), vxlan::PORT);
            for (at, b) in flips {
                let n = v.len();
                v[at % n] = b;
            }
            let _ = f.matches(&v);
        }
    }
}
