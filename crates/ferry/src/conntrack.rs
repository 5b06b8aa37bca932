//! `ferry conntrack list|delete`: the running agent's connection table, asked over its
//! local API socket, printed like `conntrack -L`.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use ferry_api::{CtAnswer, CtFilter, Request, Response};

/// Arguments of `ferry conntrack`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// List the tracked connections the filters select (all of them without filters),
    /// one `conntrack -L` style line each; the count goes to stderr.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// List at most this many (the count says how many matched).
        #[arg(long, value_name = "N", default_value_t = ferry_api::DEFAULT_CT_LIMIT)]
        limit: usize,
        /// -o json or yaml: the answer whole, both tuples, state, counters and the line of
        /// every connection.
        #[command(flatten)]
        output: crate::output::Output,
        #[command(flatten)]
        socket: Socket,
    },
    /// Delete the tracked connections the filters select; without any filter, only with
    /// --all.
    Delete {
        #[command(flatten)]
        filter: FilterArgs,
        /// Delete every connection (needed when no filter is given).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        output: crate::output::Output,
        #[command(flatten)]
        socket: Socket,
    },
}

/// Which connections: every filter given must match.
#[derive(clap::Args, Debug)]
struct FilterArgs {
    /// The conntrack zone.
    #[arg(long, value_name = "N")]
    zone: Option<u16>,
    /// An address on either side of either tuple (a Service address or its endpoint's).
    #[arg(long, value_name = "ADDR")]
    addr: Option<IpAddr>,
    /// A TCP or UDP port on either side of either tuple.
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,
    /// tcp, udp, icmp, icmpv6 or a protocol number.
    #[arg(long, value_name = "PROTO")]
    proto: Option<String>,
    /// A TCP state as conntrack prints it: SYN_SENT, SYN_RECV, ESTABLISHED, FIN_WAIT,
    /// CLOSE_WAIT, LAST_ACK, TIME_WAIT, CLOSE.
    #[arg(long, value_name = "STATE")]
    state: Option<String>,
    /// The conntrack mark, decimal or 0x hex.
    #[arg(long, value_name = "MARK", value_parser = parse_mark)]
    mark: Option<u32>,
}

/// The agent's socket.
#[derive(clap::Args, Debug)]
struct Socket {
    /// The agent's local API socket.
    #[arg(long, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    api_socket: PathBuf,
}

fn parse_mark(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| "expected a number (decimal, or hex with 0x)".into())
}

impl FilterArgs {
    /// The API's filter, checked here so that a bad value fails before the agent is
    /// asked.
    fn to_filter(&self) -> Result<CtFilter> {
        let f = CtFilter {
            zone: self.zone,
            addr: self.addr,
            port: self.port,
            proto: self.proto.clone(),
            state: self.state.clone(),
            mark: self.mark,
        };
        ferry_agent::conntrack::filter(&f).map_err(|e| anyhow!("--{e}"))?;
        Ok(f)
    }
}

fn ask(socket: &Socket, req: &Request) -> Result<CtAnswer> {
    let path = &socket.api_socket;
    let r = crate::ask::ask(path, req)?;
    match r {
        Response::Ok(a) => a
            .conntrack
            .ok_or_else(|| anyhow!("the agent's answer has no connections")),
        Response::Error(e) => bail!("the agent refused: {} ({})", e.msg, e.details),
    }
}

/// Runs `ferry conntrack`.
pub fn run(args: &Args) -> Result<()> {
    match &args.command {
        Command::List {
            filter,
            limit,
            output,
            socket,
        } => {
            let req = Request::Conntrack {
                filter: filter.to_filter()?,
                delete: false,
                limit: Some(*limit),
            };
            let a = ask(socket, &req)?;
            output.print(&a, || {
                a.entries.iter().map(|e| format!("{}\n", e.line)).collect()
            })?;
            eprintln!(
                "ferry conntrack: {} flow entries have been shown.",
                a.entries.len()
            );
            if a.truncated {
                eprintln!(
                    "ferry conntrack: {} matched; only the first {} are shown (see --limit).",
                    a.matched,
                    a.entries.len()
                );
            }
        }
        Command::Delete {
            filter,
            all,
            output,
            socket,
        } => {
            let f = filter.to_filter()?;
            if f.is_empty() && !all {
                bail!(
                    "conntrack delete without a filter would delete every connection: give \
                     --zone, --addr, --port, --proto, --state or --mark, or --all"
                );
            }
            let req = Request::Conntrack {
                filter: f,
                delete: true,
                limit: None,
            };
            let a = ask(socket, &req)?;
            output.print(&a, || {
                format!("{} flow entries have been deleted.\n", a.deleted)
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_decimal_or_hex() {
        assert_eq!(parse_mark("3"), Ok(3));
        assert_eq!(parse_mark("0x10"), Ok(16));
        assert!(parse_mark("x").is_err());
        assert!(parse_mark("-1").is_err());
    }
}
