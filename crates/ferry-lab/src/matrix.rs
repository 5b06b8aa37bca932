//! Probe matrices: from every pod of a set to every pod of the set, on ports and
//! protocols, as the Kubernetes NetworkPolicy e2e tests probe (`test/e2e/network/netpol`,
//! a truth table per port and protocol), and the difference of an expected matrix and
//! an observed one, cell by cell.
//!
//! A cell is `.` when the source reached the destination (TCP: a connection and the
//! destination's name answered to `GET /hostname`; UDP: its name answered to
//! `hostname`) and `X` when it did not, the marks of the upstream tests' truth tables.
//! One `ferry lab probe-matrix` runs in each source pod's namespace and probes all its
//! cells at once, one thread each; the sources run at the same time, so a matrix takes
//! about the time of one blocked cell (tries x timeout).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ferry_linux::cmd::Cmd;

use crate::state::{Pod, Proto, Served, State};

/// How long one try of a cell waits.
pub const TIMEOUT: Duration = Duration::from_millis(800);
/// Tries of a cell before it is called blocked (the first packet to a new neighbour may
/// wait for its resolution).
pub const TRIES: u32 = 2;

/// A reachability matrix on one port and protocol: `cells[from][to]`, pods in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    /// The pods, `NS/NAME`, rows and columns in this order.
    pub pods: Vec<String>,
    /// Whether row `i` reached column `j`.
    pub cells: Vec<Vec<bool>>,
}

impl Grid {
    /// Every cell `allowed`.
    pub fn all(pods: &[String], allowed: bool) -> Grid {
        Grid {
            pods: pods.to_vec(),
            cells: vec![vec![allowed; pods.len()]; pods.len()],
        }
    }

    /// A grid from rows of `.` (reached) and `X` (blocked), one row per source in the
    /// order of `pods`, spaces ignored.
    pub fn parse(pods: &[String], rows: &[&str]) -> Result<Grid> {
        if rows.len() != pods.len() {
            bail!("{} rows for {} pods", rows.len(), pods.len());
        }
        let mut cells = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let marks: Vec<char> = row.chars().filter(|c| !c.is_whitespace()).collect();
            if marks.len() != pods.len() {
                bail!(
                    "row {} ({}) has {} cells, not {}",
                    i + 1,
                    pods[i],
                    marks.len(),
                    pods.len()
                );
            }
            let row = marks
                .iter()
                .map(|c| match c {
                    '.' => Ok(true),
                    'X' => Ok(false),
                    other => bail!("row {} ({}): {other:?} is not . or X", i + 1, pods[i]),
                })
                .collect::<Result<Vec<bool>>>()?;
            cells.push(row);
        }
        Ok(Grid {
            pods: pods.to_vec(),
            cells,
        })
    }

    /// Whether `from` reached `to`; None for a pod not in the grid.
    pub fn get(&self, from: &str, to: &str) -> Option<bool> {
        let i = self.pods.iter().position(|p| p == from)?;
        let j = self.pods.iter().position(|p| p == to)?;
        Some(self.cells[i][j])
    }

    /// The truth table as the upstream tests print it: a header of destinations, a row
    /// per source.
    pub fn render(&self) -> String {
        let mut out = format!("{:<6}{}\n", "-", self.pods.join(" "));
        for (i, from) in self.pods.iter().enumerate() {
            let marks: Vec<String> = self.cells[i]
                .iter()
                .zip(&self.pods)
                .map(|(&c, p)| format!("{:<w$}", mark(c), w = p.len()))
                .collect();
            out += &format!("{from:<6}{}\n", marks.join(" ").trim_end());
        }
        out
    }
}

fn mark(reached: bool) -> char {
    if reached { '.' } else { 'X' }
}

/// The cells where `observed` differs from `expected` on `port`, one line each
/// (`x/a -> y/b tcp/80: expected X, got .`); a pod's traffic to itself is left out when
/// `skip_loopback` (the upstream tests ignore it: plugins differ there).
pub fn diff(port: Served, expected: &Grid, observed: &Grid, skip_loopback: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (i, from) in expected.pods.iter().enumerate() {
        for (j, to) in expected.pods.iter().enumerate() {
            if skip_loopback && i == j {
                continue;
            }
            let want = expected.cells[i][j];
            match observed.get(from, to) {
                Some(got) if got == want => {}
                Some(got) => out.push(format!(
                    "{from} -> {to} {port}: expected {}, got {}",
                    mark(want),
                    mark(got)
                )),
                None => out.push(format!(
                    "{from} -> {to} {port}: expected {}, not probed",
                    mark(want)
                )),
            }
        }
    }
    out
}

/// One answer of `ferry lab probe-matrix`: destination, port, reached.
pub type Answer = (String, Served, bool);

/// Probes every `targets` (name, address) on every `ports` from this namespace, all at
/// once; the answers in the order asked.
pub fn probe_here(targets: &[(String, IpAddr)], ports: &[Served]) -> Vec<Answer> {
    let mut handles = Vec::new();
    for (name, ip) in targets {
        for &port in ports {
            let (name, ip) = (name.clone(), *ip);
            handles.push(std::thread::spawn(move || {
                let to = SocketAddr::new(ip, port.port);
                let ok = (0..TRIES).any(|_| match port.proto {
                    Proto::Tcp => tcp_once(to, &name),
                    Proto::Udp => udp_once(to, &name),
                });
                (name, port, ok)
            }));
        }
    }
    handles.into_iter().filter_map(|h| h.join().ok()).collect()
}

/// A connection, `GET /hostname`, and `name` answered.
fn tcp_once(to: SocketAddr, name: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&to, TIMEOUT) else {
        // A refusal comes at once: wait as a lost SYN would, so that tries are spaced.
        std::thread::sleep(TIMEOUT / 4);
        return false;
    };
    let _ = s.set_read_timeout(Some(TIMEOUT));
    let _ = s.set_write_timeout(Some(TIMEOUT));
    if s.write_all(b"GET /hostname HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    answer.starts_with("HTTP/1.1 200") && answer.ends_with(&format!("\r\n\r\n{name}"))
}

/// `hostname` asked, `name` answered.
fn udp_once(to: SocketAddr, name: &str) -> bool {
    let any: SocketAddr = if to.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let Ok(s) = UdpSocket::bind(any) else {
        return false;
    };
    if s.connect(to).is_err() || s.set_read_timeout(Some(TIMEOUT)).is_err() {
        return false;
    }
    if s.send(b"hostname").is_err() {
        std::thread::sleep(TIMEOUT);
        return false;
    }
    let mut buf = [0u8; 512];
    let deadline = std::time::Instant::now() + TIMEOUT;
    while std::time::Instant::now() < deadline {
        match s.recv(&mut buf) {
            Ok(n) if &buf[..n] == name.as_bytes() => return true,
            Ok(_) => {}
            // An ICMP unreachable (no server) reads as an error at once.
            Err(_) => break,
        }
    }
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    std::thread::sleep(left);
    false
}

/// The answers as `ferry lab probe-matrix` prints them: `NAME PROTO/PORT 1|0` a line.
pub fn print_answers(answers: &[Answer]) -> String {
    answers
        .iter()
        .map(|(n, p, ok)| format!("{n} {p} {}\n", u8::from(*ok)))
        .collect()
}

/// Reads [`print_answers`]' lines back.
pub fn parse_answers(text: &str) -> Result<Vec<Answer>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let [name, port, ok] = w[..] else {
                bail!("probe answer {l:?}: not NAME PROTO/PORT 1|0");
            };
            Ok((name.to_string(), port.parse()?, ok == "1"))
        })
        .collect()
}

/// Probes from every pod of `pods` to every pod of `pods` on each of `ports` (their
/// first IPv4 addresses), one `ferry lab probe-matrix` per source in its namespace, all
/// at once: the observed grid of each port.
pub fn probe(state: &State, pods: &[&Pod], ports: &[Served]) -> Result<BTreeMap<Served, Grid>> {
    let names: Vec<String> = pods.iter().map(|p| p.id()).collect();
    let mut args = vec!["lab".to_string(), "probe-matrix".to_string()];
    for p in pods {
        let ip = p
            .ip4()
            .with_context(|| format!("pod {} has no IPv4 address", p.id()))?;
        args.extend(["--target".to_string(), format!("{}={ip}", p.id())]);
    }
    for port in ports {
        args.extend(["--port".to_string(), port.to_string()]);
    }
    let children = pods
        .iter()
        .map(|p| {
            Cmd::new(state.ferry.display().to_string())
                .args(&args)
                .netns(&p.netns)
                .command()
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("probing from {}", p.id()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut grids: BTreeMap<Served, Grid> = ports
        .iter()
        .map(|&port| (port, Grid::all(&names, false)))
        .collect();
    let mut failed = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            failed.push(format!(
                "from {}: {}",
                names[i],
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            continue;
        }
        for (to, port, ok) in parse_answers(&String::from_utf8_lossy(&out.stdout))? {
            let j = names
                .iter()
                .position(|n| *n == to)
                .with_context(|| format!("an answer for {to}, not probed"))?;
            if let Some(g) = grids.get_mut(&port) {
                g.cells[i][j] = ok;
            }
        }
    }
    if !failed.is_empty() {
        bail!("the probes failed: {}", failed.join("; "));
    }
    Ok(grids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> Vec<String> {
        ["x/a", "x/b", "y/a"].map(String::from).to_vec()
    }

    #[test]
    fn a_grid_reads_dots_and_crosses_row_by_source() {
        let g = Grid::parse(&pods(), &[". X .", "...", "X.X"]).unwrap();
        assert_eq!(g.get("x/a", "x/b"), Some(false));
        assert_eq!(g.get("x/b", "x/a"), Some(true));
        assert_eq!(g.get("y/a", "y/a"), Some(false));
        assert_eq!(g.get("z/a", "x/a"), None);
        assert!(Grid::parse(&pods(), &["...", "..."]).is_err());
        assert!(Grid::parse(&pods(), &["...", "..", "..."]).is_err());
        assert!(Grid::parse(&pods(), &["...", "..o", "..."]).is_err());
    }

    #[test]
    fn the_difference_names_only_the_cells_that_differ() {
        let tcp80: Served = "tcp/80".parse().unwrap();
        let want = Grid::parse(&pods(), &["X..", "X..", "X.."]).unwrap();
        let got = Grid::parse(&pods(), &["...", "X..", ".X."]).unwrap();
        assert_eq!(
            diff(tcp80, &want, &got, true),
            [
                "y/a -> x/a tcp/80: expected X, got .",
                "y/a -> x/b tcp/80: expected ., got X",
            ]
        );
        // Loopback compared too when asked: x/a -> x/a differs.
        let all = diff(tcp80, &want, &got, false);
        assert_eq!(all.len(), 3);
        assert_eq!(all[0], "x/a -> x/a tcp/80: expected X, got .");
        assert!(diff(tcp80, &want, &want, false).is_empty());
    }

    #[test]
    fn a_missing_pod_is_named_as_not_probed() {
        let udp81: Served = "udp/81".parse().unwrap();
        let want = Grid::all(&pods(), true);
        let got = Grid::all(&pods()[..2], true);
        let d = diff(udp81, &want, &got, true);
        assert!(d.contains(&"x/a -> y/a udp/81: expected ., not probed".to_string()));
    }

    #[test]
    fn answers_are_printed_and_read_back() {
        let a = vec![
            ("x/a".to_string(), "tcp/80".parse().unwrap(), true),
            ("y/b".to_string(), "udp/81".parse().unwrap(), false),
        ];
        let text = print_answers(&a);
        assert_eq!(text, "x/a tcp/80 1\ny/b udp/81 0\n");
        assert_eq!(parse_answers(&text).unwrap(), a);
        assert!(parse_answers("x/a tcp/80").is_err());
    }

    #[test]
    fn a_grid_renders_as_a_truth_table() {
        let g = Grid::parse(&pods(), &["X..", "...", "..X"]).unwrap();
        assert_eq!(
            g.render(),
            "-     x/a x/b y/a\nx/a   X   .   .\nx/b   .   .   .\ny/a   .   .   X\n"
        );
    }
}
