//! `ferry-cni`: a CNI plugin when run without arguments (as container runtimes run
//! it), `ferry-cni install ...` to put itself and its configuration in place.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferry_cni::install::Install;

/// ferry's CNI plugin. Without arguments it serves the CNI command in CNI_COMMAND.
#[derive(Parser)]
#[command(name = "ferry-cni", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Copy this binary into the runtime's plugin directory and write the network
    /// configuration (10-ferry.conflist), each atomically.
    Install {
        /// The CNI plugin directory.
        #[arg(long, default_value = "/opt/cni/bin")]
        bin_dir: PathBuf,
        /// The CNI network configuration directory.
        #[arg(long, default_value = "/etc/cni/net.d")]
        conf_dir: PathBuf,
        /// The agent's socket, as the plugin will reach it on the node.
        #[arg(long, default_value = ferry_api::DEFAULT_SOCKET)]
        socket: PathBuf,
    },
}

fn main() -> ExitCode {
    // Runtimes run plugins with no arguments: any argument means the command line.
    if std::env::args_os().len() <= 1 {
        return ExitCode::from(ferry_cni::plugin::main() as u8);
    }
    let Cmd::Install {
        bin_dir,
        conf_dir,
        socket,
    } = Cli::parse().command;
    let install = Install {
        bin_dir,
        conf_dir,
        socket,
    };
    let written = std::env::current_exe().and_then(|me| install.run(&me));
    match written {
        Ok(paths) => {
            for p in paths {
                println!("installed {}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ferry-cni install: {e}");
            ExitCode::FAILURE
        }
    }
}
