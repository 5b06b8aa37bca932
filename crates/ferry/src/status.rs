//! `ferry status`: the running agent's dataplane counters, asked over its local API
//! socket.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use ferry_agent::api::call;
use ferry_api::{Counters, Request, Response};

/// Arguments of `ferry status`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent's local API socket.
    #[arg(long, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    /// Print the counters as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Asks the agent and prints its counters.
pub fn run(args: &Args) -> Result<()> {
    let r = call(&args.api_socket, &Request::Counters).with_context(|| {
        format!(
            "no agent answers on {} (is `ferry agent` running? see --api-socket)",
            args.api_socket.display()
        )
    })?;
    let c = match r {
        Response::Ok(a) => a.counters.unwrap_or_default(),
        Response::Error(e) => bail!("the agent refused: {} ({})", e.msg, e.details),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", render(&c));
    }
    Ok(())
}

/// The counters as a few human-readable tables.
fn render(c: &Counters) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "tables generation {}", c.generation);
    let _ = writeln!(
        s,
        "conntrack: {} connections, {} inserted, {} refused (table full)",
        c.ct_entries, c.ct_inserted, c.ct_insert_failed
    );
    let _ = writeln!(
        s,
        "services: {} connections balanced, {} refused without endpoints; {} datagrams reassembled",
        c.service_balanced, c.service_rejected, c.reassembled
    );
    let w = c
        .ports
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        s,
        "\n{:<w$}  {:>12} {:>14} {:>12} {:>14}",
        "port", "rx packets", "rx bytes", "tx packets", "tx bytes"
    );
    for p in &c.ports {
        let _ = writeln!(
            s,
            "{:<w$}  {:>12} {:>14} {:>12} {:>14}",
            p.name, p.rx_packets, p.rx_bytes, p.tx_packets, p.tx_bytes
        );
    }
    let _ = writeln!(s, "\ndrops");
    if c.drops.is_empty() {
        let _ = writeln!(s, "  none");
    }
    for (reason, n) in &c.drops {
        let _ = writeln!(s, "  {reason:<28} {n}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_port_and_drop_reason() {
        let c = Counters {
            generation: 3,
            ports: vec![ferry_api::PortCounters {
                name: "uplink".into(),
                rx_packets: 10,
                ..Default::default()
            }],
            drops: [("ct_invalid".to_string(), 2)].into(),
            ..Counters::default()
        };
        let t = render(&c);
        assert!(t.contains("tables generation 3"), "{t}");
        assert!(t.contains("uplink") && t.contains("10"), "{t}");
        assert!(t.contains("ct_invalid") && t.contains(" 2"), "{t}");
    }
}
